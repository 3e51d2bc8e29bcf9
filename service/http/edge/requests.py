"""What the edge knows of a request before routing it: its id, whether it is a probe, its route template
(the metrics' label), and how to refuse it in its protocol's error format.
"""

from __future__ import annotations

import logging
import re

from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from service.http.errors import app_path, error_response

logger = logging.getLogger("service.errors")

OPERATIONAL_PATHS = frozenset({"/healthz", "/readyz", "/metrics", "/v2/health/live", "/v2/health/ready"})
"""Probes and scrapes: never queued or refused for load, so they answer while the service is saturated."""

REQUEST_ID_PATTERN = re.compile(r"[A-Za-z0-9._:\-]{1,128}")
"""An incoming ``X-Request-ID`` is kept only if it is this: bounded, and safe in logs and headers."""

UNMATCHED = "<unmatched>"
MAX_KNOWN_PATHS = 4096
"""Paths whose template is remembered (a dict lookup instead of trying every pattern)."""
NO_RESPONSE = 499
"""Status logged and counted for a request that ended without a response (client gone, or cancelled at shutdown)."""


class RouteTemplates:
    """Maps a request to its route's path template (``/v2/models/{model_name}/infer``), never the raw path.

    The templates are the paths of the app's OpenAPI schema (a public, stable
    view of the routes, built once on first use), so requests refused before
    routing (401, 413, 503) are labelled too. Routes left out of the schema
    (/docs) are matched by their own pattern; unknown paths share one
    label, so scanners cannot blow up the metrics' cardinality.
    """

    def __init__(self) -> None:
        self._patterns: list[tuple[re.Pattern[str], str]] | None = None
        self._known: dict[str, str] = {}

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
        if len(self._known) < MAX_KNOWN_PATHS:  # bounded: scanners' paths cannot grow it without limit
            self._known[path] = template
        return template


async def send_error(
    scope: Scope, receive: Receive, send: Send, status: int, detail: str, headers: dict[str, str] | None = None
) -> None:
    """Answer with the error body of the path's protocol (problem+json, or ``{"error"}`` under /v2)."""
    await error_response(app_path(scope), status, detail, headers=headers)(scope, receive, send)
