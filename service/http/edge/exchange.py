"""One request's state at the edge: its id, status, body progress and deadline, and its record (metrics
and the access log line) when it ends.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time

from starlette.exceptions import HTTPException
from starlette.types import Message, Receive, Scope, Send

from service.dataplane.auth import presented_key
from service.http.edge.requests import NO_RESPONSE, OPERATIONAL_PATHS, REQUEST_ID_PATTERN, RouteTemplates, send_error
from service.http.edge.security import API_CSP, DOCS_PATHS, SECURITY_HEADERS
from service.http.error_responses import app_path
from service.observability.metrics import ServiceMetrics

access_log = logging.getLogger("service.access")

CONNECTION_CLOSE = (b"connection", b"close")


def _encode(pairs: tuple[tuple[str, str], ...]) -> tuple[tuple[bytes, bytes], ...]:
    return tuple((name.encode("latin-1"), value.encode("latin-1")) for name, value in pairs)


API_HEADERS = _encode((*SECURITY_HEADERS, API_CSP))
DOCS_HEADERS = _encode(SECURITY_HEADERS)


class BodyTooLarge(HTTPException):
    """Raised from ``receive`` once a streamed body passes the limit.

    An HTTPException so that the app's handler answers it (FastAPI re-raises
    HTTPExceptions met while reading a body instead of turning them into 400s).
    """

    def __init__(self, detail: str) -> None:
        super().__init__(413, detail)


class BodyTimeout(HTTPException):
    """Raised from ``receive`` when the body arrives too slowly (408)."""

    def __init__(self, detail: str) -> None:
        super().__init__(408, detail)


class Limits:
    """The per-request limits of the edge, from settings (plain values, read on every request)."""

    def __init__(
        self,
        *,
        max_body_bytes: int,
        request_timeout_s: float,
        body_timeout_s: float,
        min_upload_bytes_per_s: float,
        retry_after_s: int = 1,
    ) -> None:
        self.max_body_bytes = max_body_bytes
        self.request_timeout_s = request_timeout_s
        self.body_timeout_s = body_timeout_s
        self.min_upload_bytes_per_s = min_upload_bytes_per_s
        self.retry_after_s = retry_after_s


class Edge:
    """What every exchange reads, built once: the limits, the metrics, the route templates, the fixed answers."""

    __slots__ = ("detail_408", "detail_413", "detail_504", "limits", "metrics", "route_template")

    def __init__(self, limits: Limits, metrics: ServiceMetrics) -> None:
        self.limits = limits
        self.metrics = metrics
        self.route_template = RouteTemplates()
        self.detail_413 = f"the request body is larger than the limit of {limits.max_body_bytes} bytes"
        self.detail_504 = (
            f"the request was not answered within the limit of {limits.request_timeout_s:g} s; "
            "send a smaller request or retry later"
        )
        self.detail_408 = (
            f"the request body did not arrive in time (allowed: {limits.body_timeout_s:g} s plus one second per "
            f"{limits.min_upload_bytes_per_s:g} bytes received)"
        )


class Exchange:
    """One request's state at the edge: its id, status, body progress and deadline."""

    __slots__ = (
        "_api_key",
        "_authorization",
        "_receive",
        "_send",
        "answer_504",
        "body_done",
        "body_t0",
        "deadline_send",
        "declared_length",
        "edge",
        "has_body",
        "path",
        "received",
        "recorded",
        "request_id",
        "scope",
        "sent",
        "started",
        "status",
        "t0",
    )

    def __init__(self, edge: Edge, scope: Scope, receive: Receive, send: Send) -> None:
        self.edge = edge
        self.scope = scope
        self._receive = receive
        self._send = send
        self.t0 = time.perf_counter()
        self.path = app_path(scope)
        incoming = None
        declared = -1
        chunked = False
        self._authorization: bytes | None = None
        self._api_key: bytes | None = None
        for name, value in scope["headers"]:  # one pass over the headers for everything the layer needs
            if name == b"content-length":
                declared = int(value) if value.isdigit() else declared
            elif name == b"transfer-encoding":
                chunked = True
            elif name == b"x-request-id" and incoming is None:
                incoming = value.decode("latin-1")
            elif name == b"authorization" and self._authorization is None:
                self._authorization = value
            elif name == b"x-api-key" and self._api_key is None:
                self._api_key = value
        # else 32 random hex digits: the form of uuid4().hex, at a fifth of its cost
        self.request_id = incoming if incoming and REQUEST_ID_PATTERN.fullmatch(incoming) else os.urandom(16).hex()
        scope.setdefault("state", {})["request_id"] = self.request_id
        self.declared_length = declared
        # A body unless the length says none; a GET or HEAD without a length has none (HTTP/2 servers send
        # no Transfer-Encoding, so a missing length on another method may be a streamed body).
        self.has_body = declared > 0 or (declared < 0 and (chunked or scope["method"] not in ("GET", "HEAD")))
        self.status: int | None = None
        self.recorded = False
        self.received = 0
        self.sent = 0
        self.body_done = not self.has_body
        self.body_t0 = 0.0
        self.answer_504: asyncio.Task[None] | None = None
        self.started = False
        self.deadline_send: Send = send

    def presented_key(self) -> str | None:
        """The API key the request presents, or None (:func:`service.dataplane.auth.presented_key`)."""
        authorization = None if self._authorization is None else self._authorization.decode("latin-1")
        return presented_key(authorization, None if self._api_key is None else self._api_key.decode("latin-1"))

    async def receive(self) -> Message:
        """The request's ``receive``, with the streamed size limit (413) and the upload deadline (408).

        What the body holds on the memory budget is the data plane's door's: the route reads it on its lease.
        """
        if self.body_done:
            return await self._receive()
        edge = self.edge
        loop = asyncio.get_running_loop()
        if not self.body_t0:
            self.body_t0 = loop.time()
        limits = edge.limits
        deadline = self.body_t0 + limits.body_timeout_s + self.received / limits.min_upload_bytes_per_s
        try:
            async with asyncio.timeout_at(deadline):
                message = await self._receive()
        except TimeoutError:
            edge.metrics.refused("body_timeout")
            raise BodyTimeout(edge.detail_408) from None
        if message["type"] == "http.request":
            self.received += len(message.get("body", b""))
            if self.received > limits.max_body_bytes:
                edge.metrics.refused("body_too_large")
                raise BodyTooLarge(edge.detail_413)
            if not message.get("more_body", False):
                self.body_done = True
        return message

    async def send(self, message: Message) -> None:
        """Adds the request id, security headers and ``Connection: close`` when due; records at the end."""
        if message["type"] == "http.response.start":
            self.status = message["status"]
            headers = message.get("headers")
            headers = [] if headers is None else list(headers)
            present = {name for name, _ in headers}
            headers.append((b"x-request-id", self.request_id.encode("latin-1")))
            for pair in DOCS_HEADERS if self.path in DOCS_PATHS else API_HEADERS:
                if pair[0] not in present:
                    headers.append(pair)
            if not self.body_done and b"connection" not in present:
                # The body will not be read: the connection ends with this answer (the server's protocol drains
                # what is still in flight for a bounded time, so the client reads the answer, not a reset).
                headers.append(CONNECTION_CLOSE)
            message["headers"] = headers
        else:
            self.sent += len(message.get("body", b""))
        await self._send(message)
        if message["type"] == "http.response.body" and not message.get("more_body", False) and not self.recorded:
            self.record()  # at the answer, not later: work abandoned at its deadline may go on after its 504

    async def guarded_send(self, message: Message) -> None:
        """The app's ``send``: drops the late answer once the 504 went out."""
        if self.answer_504 is not None:
            return
        if message["type"] == "http.response.start":
            self.started = True
        await self.deadline_send(message)

    def on_deadline(self) -> None:
        if self.started:
            return  # the answer is on its way
        self.edge.metrics.refused("deadline")
        self.answer_504 = asyncio.get_running_loop().create_task(
            send_error(self.scope, self._receive, self.deadline_send, 504, self.edge.detail_504)
        )

    def record(self) -> None:
        """Count and log the request once: when its answer has been sent, or when it ends without one."""
        self.recorded = True
        seconds = time.perf_counter() - self.t0
        status = NO_RESPONSE if self.status is None else self.status
        scope = self.scope
        self.edge.metrics.observe_request(
            scope["method"],
            self.edge.route_template(scope),
            status,
            seconds,
            path=self.path,
            request_bytes=self.received if self.has_body else None,
            response_bytes=self.sent,
        )
        # Probes and scrapes at debug: a kubelet and Prometheus call them every few seconds.
        level = logging.DEBUG if self.path in OPERATIONAL_PATHS else logging.INFO
        if access_log.isEnabledFor(level):
            client = scope.get("client")
            access_log.log(
                level,
                "request",
                extra={
                    "method": scope["method"],
                    "path": self.path,
                    "status": status,
                    "duration_ms": round(seconds * 1e3, 3),
                    "client": client[0] if client else None,
                    "request_id": self.request_id,
                },
            )
