"""One pure-ASGI layer for every request: request id, auth, the declared size, deadline, metrics, access log,
security headers, and the 499/500 answers.

It replaces a stack of six middleware (each re-reading the headers and
wrapping ``send``) with one pass: the request headers are scanned once, the
response headers are pre-encoded lists built at start-up, and the route
templates of the metrics are compiled once. CORS, when configured, stays
Starlette's, between the context part (outside: so preflights and refusals are
logged, counted and carry the security headers) and the guards (inside: so
preflights pass without a key and 401/413 still carry the CORS headers).

Order of the guards (:meth:`ServiceMiddleware._guarded`): API key (401, unless
the data plane exempts the path: ATTN_AUTH_EXEMPT_PATHS, the same rule gRPC's
probes follow; the pages that hold no data are public unless
ATTN_PAGES_PUBLIC=false), declared body size (413), then the deadline (504)
around the app. While the route reads the body, the size limit (413, streamed
bodies) and the upload deadline (408) are enforced in ``receive``. Admission,
the body's memory and the heap trim after a large body are the data plane's
door's (:mod:`service.dataplane.door`), which each inference route enters, as
gRPC's ``ModelInfer`` does. Any answer sent before the body was read carries
``Connection: close`` (the server's protocol then drains the rest for a
bounded time and closes: the client reads the answer, not a reset).

A request still running when uvicorn's shutdown grace ends is cancelled; it is
answered 503 with ``Retry-After`` and ``Connection: close`` (and counted and
logged as such), never 500 with a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Receive, Scope, Send

from service.dataplane.auth import MISSING_KEY, WRONG_KEY
from service.dataplane.plane import DataPlane
from service.http.edge.exchange import Edge, Exchange, Limits
from service.http.edge.requests import send_error
from service.http.edge.security import CorsMiddleware, is_page
from service.observability.logs import REQUEST_ID
from service.observability.metrics import ServiceMetrics

logger = logging.getLogger("service.errors")
limits_logger = logging.getLogger("service.limits")


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
        self.limits = limits
        self.edge = Edge(limits, metrics)
        self.keys = plane.api_keys
        self.public_pages = public_pages
        self.detail_413 = self.edge.detail_413
        self.detail_shutdown = (
            "the server is shutting down and its grace period for requests in flight (ATTN_SHUTDOWN_GRACE_S) "
            "ended before this one was answered; retry it"
        )
        self.inner: Callable[[Scope, Receive, Send], Awaitable[None]] = (
            CorsMiddleware(self._guarded, **cors) if cors else self._guarded
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        exchange = Exchange(self.edge, scope, receive, send)
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
        """Auth, declared size and the deadline around the app (admission is the data plane's door's)."""
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
        await self._with_deadline(exchange, scope, receive, send)

    async def _with_deadline(self, exchange: Exchange, scope: Scope, receive: Receive, send: Send) -> None:
        """504 at the deadline from a timer, while the work goes on (a worker thread cannot be interrupted).

        The late answer is dropped; the request keeps its admission (and any compute slot) until its
        work really ends, so abandoned work cannot pile up.
        """
        exchange.deadline_send = send
        timer = asyncio.get_running_loop().call_later(self.limits.request_timeout_s, exchange.on_deadline)
        try:
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
