"""One pure-ASGI layer for every request: request id, auth, limits, admission, deadline, metrics,
access log, security headers, and the 499/500 answers.

It replaces a stack of six middleware (each re-reading the headers and
wrapping ``send``) with one pass: the request headers are scanned once, the
response headers are pre-encoded lists built at start-up, and the route
templates of the metrics are compiled once. CORS, when configured, stays
Starlette's, between the context part (outside: so preflights and refusals are
logged, counted and carry the security headers) and the guards (inside: so
preflights pass without a key and 401/413/503 still carry the CORS headers).

Order of the guards (:meth:`ServiceMiddleware._guarded`): API key (401),
declared body size (413), admission by expected wait (503, decided from the
headers before any of the body is read), then the deadline (504) around the
app. While the route reads the body, the size limit (413, streamed bodies) and
the upload deadline (408) are enforced in ``receive``. A refusal sent before
the body was read (503, 408) carries ``Connection: close``: the server then
closes the connection instead of reading and discarding the rest of the
upload.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.errors import app_path
from service.middleware.base import OPERATIONAL_PATHS, send_error
from service.middleware.context import NO_RESPONSE, REQUEST_ID_PATTERN, RouteTemplates
from service.middleware.limits import Admission, Overloaded
from service.middleware.security import API_CSP, DOCS_PATHS, SECURITY_HEADERS, ApiKeys, CorsMiddleware
from service.observability.logs import REQUEST_ID
from service.observability.metrics import ServiceMetrics

access_log = logging.getLogger("service.access")
logger = logging.getLogger("service.errors")
limits_logger = logging.getLogger("service.limits")

CONNECTION_CLOSE = (b"connection", b"close")
CLOSE_WHEN_UNREAD = frozenset({408, 503})
"""Refusals that close the connection when the request's body was not read (instead of draining it)."""


def _encode(pairs: Sequence[tuple[str, str]]) -> tuple[tuple[bytes, bytes], ...]:
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
    """The per-request limits of the layer, from settings (plain values, read on every request)."""

    def __init__(
        self,
        *,
        max_body_bytes: int,
        request_timeout_s: float,
        body_timeout_s: float,
        min_upload_bytes_per_s: float,
        debug_delay_s: float = 0.0,
    ) -> None:
        self.max_body_bytes = max_body_bytes
        self.request_timeout_s = request_timeout_s
        self.body_timeout_s = body_timeout_s
        self.min_upload_bytes_per_s = min_upload_bytes_per_s
        self.debug_delay_s = debug_delay_s


class ServiceMiddleware:
    """The service's one middleware layer (see the module docstring)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        metrics: ServiceMetrics,
        admission: Admission,
        limits: Limits,
        api_keys: Sequence[str] | None = None,
        auth_exempt: Collection[str] = (),
        cors: dict[str, Any] | None = None,
    ) -> None:
        self.app = app
        self.metrics = metrics
        self.admission = admission
        self.limits = limits
        self.keys = ApiKeys(api_keys) if api_keys else None
        self.auth_exempt = frozenset(auth_exempt)
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
        self.inner: Callable[[Scope, Receive, Send], Awaitable[None]] = (
            CorsMiddleware(self._guarded, **cors) if cors else self._guarded
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        exchange = _Exchange(self, scope, receive, send)
        scope["attn.exchange"] = exchange
        token = REQUEST_ID.set(exchange.request_id)
        try:
            await self.inner(scope, exchange.receive if exchange.has_body else receive, exchange.send)
        except ClientDisconnect:
            # The client went away while sending its request: its doing, not a server error (logged 499).
            limits_logger.info(
                "client disconnected before its request was complete: %s %s", scope["method"], exchange.path
            )
        except Exception:
            logger.exception("unhandled exception while serving %s %s", scope["method"], exchange.path)
            if exchange.status is None:
                await send_error(
                    scope,
                    receive,
                    exchange.send,
                    500,
                    "the server failed to answer this request; "
                    f"quote request id {exchange.request_id} when reporting it",
                )
            # else the response had begun: the server closes the connection
        finally:
            if not exchange.recorded:
                exchange.record()
            REQUEST_ID.reset(token)
            # Break the request's two reference cycles (scope <-> exchange, and the exchange's deadline_send,
            # its own bound send): else each request left ~25 objects (its scope, the app's exit stack, the
            # server's send and receive) to the garbage collector. Nothing sends after this point: the
            # deadline timer is cancelled and a 504 has been awaited.
            del scope["attn.exchange"]
            exchange.deadline_send = send

    async def _guarded(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Auth, declared size, admission and the deadline around the app."""
        exchange: _Exchange = scope["attn.exchange"]
        path = exchange.path
        if self.keys is not None and path not in self.auth_exempt:
            key = exchange.presented_key()
            if key is None or not self.keys.accepts(key):
                await self._unauthorized(scope, receive, send, key)
                return
        if exchange.declared_length > self.limits.max_body_bytes:
            self.metrics.rejected.labels("body_too_large").inc()
            await send_error(scope, receive, send, 413, self.detail_413)
            return
        if path in OPERATIONAL_PATHS:
            await self._with_deadline(exchange, scope, receive, send)
            return
        admission = self.admission
        try:
            admission.admit()
        except Overloaded as exc:
            self.metrics.rejected.labels(exc.reason).inc()
            retry = str(exc.retry_after_s)
            await send_error(
                scope,
                receive,
                send,
                503,
                f"the server is at capacity ({admission.admitted} requests admitted for {admission.slots} compute "
                f"slots, expected wait {admission.expected_wait_s():.1f} s, target {admission.target_wait_s:g} s); "
                f"retry after {retry} s",
                headers={"Retry-After": retry},
            )
            return
        try:
            await self._with_deadline(exchange, scope, receive, send, self.limits.debug_delay_s)
        finally:
            admission.leave()

    async def _with_deadline(
        self, exchange: _Exchange, scope: Scope, receive: Receive, send: Send, delay_s: float = 0.0
    ) -> None:
        """504 at the deadline from a timer, while the work goes on (a worker thread cannot be interrupted).

        The late answer is dropped; the request keeps its admission (and any compute slot) until its
        work really ends, so abandoned work cannot pile up.
        """
        exchange.deadline_send = send
        timer = asyncio.get_running_loop().call_later(self.limits.request_timeout_s, exchange.on_deadline)
        try:
            if delay_s:  # ATTN_DEBUG_DELAY_S (tests only): work that holds a compute slot this long
                try:
                    async with self.admission.computing():
                        await asyncio.sleep(delay_s)
                except Overloaded as exc:
                    self.metrics.rejected.labels(exc.reason).inc()
                    retry = str(exc.retry_after_s)
                    await send_error(
                        scope, receive, exchange.guarded_send, 503, f"retry after {retry} s", {"Retry-After": retry}
                    )
                    return
            await self.app(scope, receive, exchange.guarded_send)
        except Exception:
            if exchange.answer_504 is None:
                raise
            limits_logger.warning("work abandoned at its deadline failed afterwards", exc_info=True)
        finally:
            timer.cancel()
            if exchange.answer_504 is not None:
                await exchange.answer_504  # the server must not see this request end before its 504 is out

    async def _unauthorized(self, scope: Scope, receive: Receive, send: Send, key: str | None) -> None:
        self.metrics.rejected.labels("unauthorized").inc()
        if key is None:
            detail = "this endpoint needs an API key: send 'Authorization: Bearer <key>' or 'X-API-Key: <key>'"
            challenge = 'Bearer realm="attention-service"'
        else:
            detail = "the API key is not valid"
            challenge = 'Bearer realm="attention-service", error="invalid_token"'
        await send_error(scope, receive, send, 401, detail, headers={"WWW-Authenticate": challenge})


class _Exchange:
    """One request's state in :class:`ServiceMiddleware`: its id, status, body progress and deadline."""

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
        "has_body",
        "mw",
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

    def __init__(self, mw: ServiceMiddleware, scope: Scope, receive: Receive, send: Send) -> None:
        self.mw = mw
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
        """The API key the request presents, or None (see :func:`service.middleware.security.presented_key`)."""
        if self._authorization is not None:
            scheme, _, credentials = self._authorization.decode("latin-1").strip().partition(" ")
            return credentials.strip() if scheme.lower() == "bearer" else ""
        key = self._api_key.decode("latin-1").strip() if self._api_key is not None else ""
        return key or None

    async def receive(self) -> Message:
        """The request's ``receive``, with the streamed size limit (413) and the upload deadline (408)."""
        if self.body_done:
            return await self._receive()
        mw = self.mw
        loop = asyncio.get_running_loop()
        if not self.body_t0:
            self.body_t0 = loop.time()
        limits = mw.limits
        deadline = self.body_t0 + limits.body_timeout_s + self.received / limits.min_upload_bytes_per_s
        try:
            async with asyncio.timeout_at(deadline):
                message = await self._receive()
        except TimeoutError:
            mw.metrics.rejected.labels("body_timeout").inc()
            raise BodyTimeout(mw.detail_408) from None
        if message["type"] == "http.request":
            self.received += len(message.get("body", b""))
            if self.received > limits.max_body_bytes:
                mw.metrics.rejected.labels("body_too_large").inc()
                raise BodyTooLarge(mw.detail_413)
            if not message.get("more_body", False):
                self.body_done = True
        return message

    async def send(self, message: Message) -> None:
        """Adds the request id, security headers and ``Connection: close`` when due; records at the end."""
        if message["type"] == "http.response.start":
            status = self.status = message["status"]
            headers = message.get("headers")
            headers = [] if headers is None else list(headers)
            present = {name for name, _ in headers}
            headers.append((b"x-request-id", self.request_id.encode("latin-1")))
            for pair in DOCS_HEADERS if self.path in DOCS_PATHS else API_HEADERS:
                if pair[0] not in present:
                    headers.append(pair)
            if not self.body_done and status in CLOSE_WHEN_UNREAD and b"connection" not in present:
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
        self.mw.metrics.rejected.labels("deadline").inc()
        self.answer_504 = asyncio.get_running_loop().create_task(
            send_error(self.scope, self._receive, self.deadline_send, 504, self.mw.detail_504)
        )

    def record(self) -> None:
        """Count and log the request once: when its answer has been sent, or when it ends without one."""
        self.recorded = True
        seconds = time.perf_counter() - self.t0
        status = NO_RESPONSE if self.status is None else self.status
        scope = self.scope
        self.mw.metrics.observe_request(
            scope["method"],
            self.mw.route_template(scope),
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
