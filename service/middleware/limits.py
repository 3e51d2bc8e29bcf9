"""Limits enforced before and around the routes: body size (413), deadline (504), admission (503).

All three are pure ASGI middleware (no ``BaseHTTPMiddleware``): they wrap
``receive``/``send`` and never buffer a body themselves.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Collection

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.errors import app_path
from service.middleware.base import header, send_error
from service.observability.metrics import ServiceMetrics

logger = logging.getLogger("service.limits")


class BodyTooLarge(HTTPException):
    """Raised from ``receive`` once a streamed body passes the limit.

    An HTTPException so that the app's handler answers it (FastAPI re-raises
    HTTPExceptions met while reading a body instead of turning them into 400s).
    """

    def __init__(self, detail: str) -> None:
        super().__init__(413, detail)


class BodySizeLimitMiddleware:
    """413 for a body over ``max_bytes``: at once from ``Content-Length``, or as soon as a streamed
    (chunked) body passes the limit, so an oversized body is never read in full.

    The connection is kept open: the server discards the rest of the upload as it arrives (no
    buffering), and the client can read its 413. Closing at once would reset the connection under a
    client still sending, and the reset can destroy the answer before the client reads it.
    """

    def __init__(self, app: ASGIApp, max_bytes: int, metrics: ServiceMetrics) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.metrics = metrics
        self.detail = f"the request body is larger than the limit of {max_bytes} bytes"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = header(scope, b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            self.metrics.rejected.labels("body_too_large").inc()
            await send_error(scope, receive, send, 413, self.detail)
            return
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    self.metrics.rejected.labels("body_too_large").inc()
                    raise BodyTooLarge(self.detail)
            return message

        await self.app(scope, limited_receive, send)


class DeadlineMiddleware:
    """504 when a request is not answered within ``timeout_s``.

    A timer answers 504 at the deadline, from a task of its own, even while the
    request's work goes on: a worker thread cannot be interrupted, and
    cancelling the request would only abandon its thread. The work is left to
    finish and its late answer is dropped. Since the admission gate sits inside
    this middleware, work that outlives its deadline keeps its slot until it
    really ends: abandoned threads cannot pile up past ``max_concurrent_requests``.
    (A timer rather than a task per request: this is on every request's path.)
    """

    def __init__(self, app: ASGIApp, timeout_s: float, metrics: ServiceMetrics) -> None:
        self.app = app
        self.timeout_s = timeout_s
        self.metrics = metrics
        self.detail = (
            f"the request was not answered within the limit of {timeout_s:g} s; send a smaller request or retry later"
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False
        answer_504: asyncio.Task[None] | None = None

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if answer_504 is not None:
                return  # the 504 has been sent: the late answer is dropped
            started = started or message["type"] == "http.response.start"
            await send(message)

        def on_deadline() -> None:
            nonlocal answer_504
            if started:
                return  # the answer is on its way
            self.metrics.rejected.labels("deadline").inc()
            answer_504 = asyncio.get_running_loop().create_task(send_error(scope, receive, send, 504, self.detail))

        timer = asyncio.get_running_loop().call_later(self.timeout_s, on_deadline)
        try:
            await self.app(scope, receive, guarded_send)
        except Exception:
            if answer_504 is None:
                raise
            logger.warning("work abandoned at its deadline failed afterwards", exc_info=True)
        finally:
            timer.cancel()
            if answer_504 is not None:
                await answer_504  # the server must not see this request end before its 504 is out


class Overloaded(Exception):
    """No slot and no room (``queue_full``) or no slot in time (``queue_timeout``)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class AdmissionGate:
    """At most ``limit`` holders at once; up to ``max_queue`` more wait in FIFO order, each for at
    most ``queue_timeout_s``. Runs on one event loop (no locks needed).
    """

    def __init__(
        self, limit: int, max_queue: int, queue_timeout_s: float, on_change: Callable[[int, int], None] | None = None
    ) -> None:
        self.limit = limit
        self.max_queue = max_queue
        self.queue_timeout_s = queue_timeout_s
        self.active = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._on_change = on_change or (lambda active, queued: None)

    @property
    def queued(self) -> int:
        return len(self._waiters)

    async def acquire(self) -> None:
        """Take a slot, waiting in the queue if need be; raise :class:`Overloaded` if none comes."""
        if self.active < self.limit and not self._waiters:
            self.active += 1
            self._on_change(self.active, self.queued)
            return
        if len(self._waiters) >= self.max_queue:
            raise Overloaded("queue_full")
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        self._on_change(self.active, self.queued)
        try:
            done, _ = await asyncio.wait((waiter,), timeout=self.queue_timeout_s)
        except asyncio.CancelledError:
            self._leave(waiter)
            raise
        if not done:
            self._leave(waiter)
            raise Overloaded("queue_timeout")

    def _leave(self, waiter: asyncio.Future[None]) -> None:
        if waiter.done():  # a slot was handed over in the same instant: pass it on
            self.release()
            return
        waiter.cancel()
        self._waiters.remove(waiter)
        self._on_change(self.active, self.queued)

    def release(self) -> None:
        """Give the slot to the oldest waiter, or free it."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                self._on_change(self.active, self.queued)
                return
        self.active -= 1
        self._on_change(self.active, self.queued)


class AdmissionMiddleware:
    """Bounds the requests in flight: past ``limit`` running and ``max_queue`` waiting, or after
    ``queue_timeout_s`` in the queue, the answer is 503 with ``Retry-After`` at once instead of
    ever-growing latency. ``exempt`` paths (probes, metrics) are never queued.
    """

    def __init__(
        self,
        app: ASGIApp,
        gate: AdmissionGate,
        exempt: Collection[str],
        retry_after_s: int,
        metrics: ServiceMetrics,
        debug_delay_s: float = 0.0,
    ) -> None:
        self.app = app
        self.gate = gate
        self.exempt = frozenset(exempt)
        self.retry_after = str(retry_after_s)
        self.metrics = metrics
        self.debug_delay_s = debug_delay_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or app_path(scope) in self.exempt:
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        try:
            await self.gate.acquire()
        except Overloaded as exc:
            self.metrics.rejected.labels(exc.reason).inc()
            await send_error(
                scope,
                receive,
                send,
                503,
                f"the server is at capacity ({self.gate.limit} requests in flight, {self.gate.queued} waiting); "
                f"retry after {self.retry_after} s",
                headers={"Retry-After": self.retry_after},
            )
            return
        self.metrics.queue_wait.observe(time.perf_counter() - t0)
        try:
            if self.debug_delay_s:
                await asyncio.sleep(self.debug_delay_s)
            await self.app(scope, receive, send)
        finally:
            self.gate.release()
