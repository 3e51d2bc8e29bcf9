"""One pure-ASGI layer for every request: request id, auth, limits, admission, deadline, metrics,
access log, security headers, and the 499/500 answers.

It replaces a stack of six middleware (each re-reading the headers and
wrapping ``send``) with one pass: the request headers are scanned once, the
response headers are pre-encoded lists built at start-up, and the route
templates of the metrics are compiled once. CORS, when configured, stays
Starlette's, between the context part (outside: so preflights and refusals are
logged, counted and carry the security headers) and the guards (inside: so
preflights pass without a key and 401/413/503 still carry the CORS headers).

Order of the guards (:meth:`ServiceMiddleware._guarded`): API key (401, unless
the data plane exempts the path: ATTN_AUTH_EXEMPT_PATHS, the same rule gRPC's
probes follow; the pages that hold no data are public unless
ATTN_PAGES_PUBLIC=false), declared
body size (413), admission by expected wait (503, decided from the headers
before any of the body is read), the body's declared length reserved on the
memory budget (503 when the bodies' share is full: the data plane's share,
which gRPC messages hold too), then the deadline (504) around the app. While
the route reads the body, the size limit (413, streamed bodies), the memory
reservation of a body without Content-Length and the upload deadline (408) are
enforced in ``receive``. Any answer sent before the body was read carries
``Connection: close`` (the server's protocol then drains the rest for a
bounded time and closes: the client reads the answer, not a reset).

A request still running when uvicorn's shutdown grace ends is cancelled; it is
answered 503 with ``Retry-After`` and ``Connection: close`` (and counted and
logged as such), never 500 with a traceback. When a request that held a large
body ends, the C heap's free memory is given back (:func:`release_after`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Receive, Scope, Send

from service.dataplane.admission import Overloaded
from service.dataplane.auth import MISSING_KEY, WRONG_KEY
from service.dataplane.errors import ServiceError
from service.dataplane.memory import release_after
from service.dataplane.plane import DataPlane
from service.http.edge.exchange import Exchange
from service.http.edge.requests import OPERATIONAL_PATHS, RouteTemplates, send_error
from service.http.edge.security import CorsMiddleware, is_page
from service.observability.logs import REQUEST_ID
from service.observability.metrics import ServiceMetrics

logger = logging.getLogger("service.errors")
limits_logger = logging.getLogger("service.limits")


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
        retry_after_s: int = 1,
    ) -> None:
        self.max_body_bytes = max_body_bytes
        self.request_timeout_s = request_timeout_s
        self.body_timeout_s = body_timeout_s
        self.min_upload_bytes_per_s = min_upload_bytes_per_s
        self.debug_delay_s = debug_delay_s
        self.retry_after_s = retry_after_s


class ServiceMiddleware:
    """The service's one middleware layer (see the module docstring)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        plane: DataPlane,
        metrics: ServiceMetrics,
        limits: Limits,
        public_pages: bool = True,
        cors: dict[str, Any] | None = None,
    ) -> None:
        self.app = app
        self.metrics = metrics
        self.plane = plane
        self.admission = plane.admission
        self.limits = limits
        self.keys = plane.api_keys
        self.public_pages = public_pages
        self.route_template = RouteTemplates()
        self.body_share = plane.body_share  # the data plane's: gRPC messages hold the same share
        self.detail_413 = f"the request body is larger than the limit of {limits.max_body_bytes} bytes"
        self.detail_504 = (
            f"the request was not answered within the limit of {limits.request_timeout_s:g} s; "
            "send a smaller request or retry later"
        )
        self.detail_shutdown = (
            "the server is shutting down and its grace period for requests in flight (ATTN_SHUTDOWN_GRACE_S) "
            "ended before this one was answered; retry it"
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
        exchange = Exchange(self, scope, receive, send)
        scope["attn.exchange"] = exchange
        token = REQUEST_ID.set(exchange.request_id)
        try:
            await self.inner(scope, exchange.receive if exchange.has_body else receive, exchange.send)
        except ClientDisconnect:
            # The client went away while sending its request: its doing, not a server error (logged 499).
            limits_logger.info(
                "client disconnected before its request was complete: %s %s", scope["method"], exchange.path
            )
        except asyncio.CancelledError:
            # uvicorn cancels the requests still running when its shutdown grace ends: answered, not a 500.
            await self._cancelled(exchange, scope, receive)
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
        exchange: Exchange = scope["attn.exchange"]
        path = exchange.path
        if self.plane.needs_key(path) and not (self.public_pages and is_page(scope["method"], path)):
            key = exchange.presented_key()
            if key is None or self.keys is None or not self.keys.accepts(key):
                await self._unauthorized(scope, receive, send, key)
                return
        if exchange.declared_length > self.limits.max_body_bytes:
            self.metrics.refused("body_too_large")
            await send_error(scope, receive, send, 413, self.detail_413)
            return
        if path in OPERATIONAL_PATHS:
            await self._with_deadline(exchange, scope, receive, send)
            return
        admission = self.admission
        try:
            admission.admit()
        except Overloaded as exc:
            self.metrics.refused(exc.reason)
            headers = {"Retry-After": str(exc.retry_after_s)}
            await send_error(scope, receive, send, 503, admission.refusal(exc), headers=headers)
            return
        try:
            if exchange.has_body:
                # The body will be held in memory until the request ends: on the budget from now, once.
                exchange.body_lease = self.body_share.lease()
                if not exchange.hold(exchange.declared_length):
                    self.metrics.refused("body_memory")
                    detail = self.body_share.refusal(exchange.declared_length)
                    headers = {"Retry-After": str(self.body_share.retry_after_s)}
                    await send_error(scope, receive, send, 503, detail, headers=headers)
                    return
            await self._with_deadline(exchange, scope, receive, send, self.limits.debug_delay_s)
        finally:
            admission.leave()
            lease = exchange.body_lease
            if lease is not None:
                release_after(max(exchange.received, lease.held))  # the body is freed: trim if it was large
                lease.release()

    async def _with_deadline(
        self, exchange: Exchange, scope: Scope, receive: Receive, send: Send, delay_s: float = 0.0
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
                    await self.plane.scheduler.hold_slot(delay_s)
                except ServiceError as exc:
                    headers = {"Retry-After": str(exc.retry_after_s)}
                    await send_error(scope, receive, exchange.guarded_send, 503, exc.message, headers)
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

    async def _cancelled(self, exchange: Exchange, scope: Scope, receive: Receive) -> None:
        """A request cancelled by the server (its shutdown grace ended): 503 if nothing was sent yet, else the
        connection just ends; either way without a traceback.
        """
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()  # handled here: the task ends normally
        limits_logger.warning(
            "request still in flight when the shutdown grace ended: %s %s", scope["method"], exchange.path
        )
        if exchange.status is not None:
            return  # the answer had begun: the server closes the connection
        self.metrics.refused("shutdown")
        headers = {"Retry-After": str(self.limits.retry_after_s), "Connection": "close"}
        with contextlib.suppress(Exception):
            async with asyncio.timeout(1.0):  # a client that reads nothing must not hold the exit
                await send_error(scope, receive, exchange.send, 503, self.detail_shutdown, headers=headers)

    async def _unauthorized(self, scope: Scope, receive: Receive, send: Send, key: str | None) -> None:
        self.metrics.refused("unauthorized")
        if key is None:
            detail = MISSING_KEY
            challenge = 'Bearer realm="attention-service"'
        else:
            detail = WRONG_KEY
            challenge = 'Bearer realm="attention-service", error="invalid_token"'
        await send_error(scope, receive, send, 401, detail, headers={"WWW-Authenticate": challenge})
