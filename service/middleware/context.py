"""Request context: request id, one access-log line and the request metrics per request, and the 500 answer."""

from __future__ import annotations

import logging
import re
import time
import uuid

from starlette.datastructures import MutableHeaders
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.errors import app_path
from service.middleware.base import header, send_error
from service.observability.logs import REQUEST_ID
from service.observability.metrics import ServiceMetrics

access_log = logging.getLogger("service.access")
logger = logging.getLogger("service.errors")

REQUEST_ID_PATTERN = re.compile(r"[A-Za-z0-9._:\-]{1,128}")
"""An incoming ``X-Request-ID`` is kept only if it is this: bounded, and safe in logs and headers."""

UNMATCHED = "<unmatched>"
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
        for pattern, template in self._patterns:
            if pattern.match(path):
                return template
        return UNMATCHED


class RequestContextMiddleware:
    """Gives each request an id (``X-Request-ID`` when valid, else a new one), echoes it in the
    response, writes one ``service.access`` log line and the request metrics, and turns an
    exception nothing else handled into a logged 500 with no internals in the body.
    """

    def __init__(self, app: ASGIApp, metrics: ServiceMetrics) -> None:
        self.app = app
        self.metrics = metrics
        self.route_template = RouteTemplates()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        incoming = header(scope, b"x-request-id")
        request_id = incoming if incoming and REQUEST_ID_PATTERN.fullmatch(incoming) else uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = request_id
        token = REQUEST_ID.set(request_id)
        status: int | None = None
        recorded = False

        def record() -> None:
            """Count and log the request once: when its answer has been sent, or when it ends without one."""
            nonlocal recorded
            recorded = True
            seconds = time.perf_counter() - t0
            answered = NO_RESPONSE if status is None else status
            self.metrics.observe_request(scope["method"], self.route_template(scope), answered, seconds)
            client = scope.get("client")
            access_log.info(
                "request",
                extra={
                    "method": scope["method"],
                    "path": app_path(scope),
                    "status": answered,
                    "duration_ms": round(seconds * 1e3, 3),
                    "client": client[0] if client else None,
                    "request_id": request_id,
                },
            )

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                MutableHeaders(scope=message)["x-request-id"] = request_id
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False) and not recorded:
                record()  # at the answer, not later: work abandoned at its deadline may go on after its 504

        try:
            await self.app(scope, receive, send_with_id)
        except Exception:
            logger.exception("unhandled exception while serving %s %s", scope["method"], app_path(scope))
            if status is None:
                await send_error(
                    scope,
                    receive,
                    send_with_id,
                    500,
                    f"the server failed to answer this request; quote request id {request_id} when reporting it",
                )
            # else the response had begun: the server closes the connection
        finally:
            if not recorded:
                record()
            REQUEST_ID.reset(token)
