"""What the edge knows of a request before routing it: its id, whether it is a probe, its route template
(the metrics' label), and how to refuse it in its protocol's error format.
"""

from __future__ import annotations

import logging
import re

from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from service.http.error_responses import app_path, error_response

logger = logging.getLogger("service.errors")

OPERATIONAL_PATHS = frozenset({"/healthz", "/readyz", "/metrics", "/v2/health/live", "/v2/health/ready"})
"""Probes and scrapes: never queued or refused for load, so they answer while the service is saturated."""

REQUEST_ID_PATTERN = re.compile(r"[A-Za-z0-9._:\-]{1,128}")
"""An incoming ``X-Request-ID`` is kept only if it is this: bounded, and safe in logs and headers."""

UNMATCHED = "<unmatched>"
MAX_KNOWN_PATHS = 4096
"""Paths whose template is remembered (a dict lookup instead of trying every pattern)."""
MAX_KNOWN_PATH_BYTES = 256
"""Longer paths are matched every time, never remembered."""
MAX_KNOWN_BYTES = 1 << 20
"""The remembered paths' characters in all: the cache stays under about 1.5 MiB whatever clients send."""
NO_RESPONSE = 499
"""Status logged and counted for a request that ended without a response (client gone, or cancelled at shutdown)."""


class RouteTemplates:
    """Maps a request to its route's path template (``/v2/models/{model_name}/infer``), never the raw path.

    The templates are the paths of the app's OpenAPI schema (a public, stable
    view of the routes, built once on first use), so requests refused before
    routing (401, 413, 503) are labelled too. Routes left out of the schema
    (/docs) are matched by their own pattern; unknown paths share one
    label, so scanners cannot blow up the metrics' cardinality.

    Only paths that matched a route, of at most :data:`MAX_KNOWN_PATH_BYTES`, are remembered, up to
    :data:`MAX_KNOWN_PATHS` of them and :data:`MAX_KNOWN_BYTES` in all: a scanner's paths (5,000 of 60 KB
    each kept 245 MB before) cost a match each time and no memory.
    """

    def __init__(self) -> None:
        self._patterns: list[tuple[re.Pattern[str], str]] | None = None
        self._known: dict[str, str] = {}
        self._known_bytes = 0

    def _compile(self, app: object) -> list[tuple[re.Pattern[str], str]]:
        try:
            # scope["app"] is the FastAPI app here; a Starlette app without openapi() lands in the except.
            paths = app.openapi().get("paths", {})  # type: ignore[attr-defined]
        except Exception:  # metrics must never break a request
            logger.exception("no OpenAPI paths for the route labels")
            paths = {}
        patterns = [(re.compile("^" + re.sub(r"\\{[^/]+?\\}", "[^/]+", re.escape(path)) + "$"), path) for path in paths]
        # Plain routes left out of the schema (/docs, /openapi.json) are matched by their own pattern.
        patterns += [
            (r.path_regex, r.path) for r in getattr(app, "routes", ()) if isinstance(r, Route) and r.path not in paths
        ]
        return patterns

    def __call__(self, scope: Scope) -> str:
        if self._patterns is None:
            self._patterns = self._compile(scope.get("app"))
        path = app_path(scope)
        template = self._known.get(path)
        if template is not None:
            return template
        template = UNMATCHED
        for pattern, candidate in self._patterns:
            if pattern.match(path):
                template = candidate
                break
        if (
            template is not UNMATCHED
            and len(path) <= MAX_KNOWN_PATH_BYTES
            and len(self._known) < MAX_KNOWN_PATHS
            and self._known_bytes + len(path) <= MAX_KNOWN_BYTES
        ):
            self._known[path] = template
            self._known_bytes += len(path)
        return template


async def send_error(
    scope: Scope, receive: Receive, send: Send, status: int, detail: str, headers: dict[str, str] | None = None
) -> None:
    """Answer with the error body of the path's protocol (problem+json, or ``{"error"}`` under /v2)."""
    await error_response(app_path(scope), status, detail, headers=headers)(scope, receive, send)
