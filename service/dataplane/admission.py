"""Admission: who gets in (decided before the request's body is read, by expected wait) and who computes
(a few slots). One :class:`Admission` per process serves every front end: a gRPC request queues behind
REST requests and the other way round.

Two separate bounds, so that uploads never hold the CPU's slots:

- :class:`Admission` decides, before the body is read, whether a request is
  taken at all. It is admitted while its expected wait for a compute slot
  (requests ahead of it x recent service time per slot) stays under a target
  and the requests waiting stay under a count; otherwise it is refused at once
  (:meth:`Admission.refusal` says why, for every protocol alike).
- :class:`AdmissionGate` holds the compute slots: at most ``limit`` requests
  do CPU work at once (:class:`service.dataplane.scheduling.Scheduler` takes a
  slot around the thread-pool work); the others wait in FIFO order for at most
  ``queue_timeout_s``.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

EWMA_WEIGHT = 0.2
"""Weight of the newest service time in the moving average (about the last 5 requests count)."""


class Overloaded(Exception):
    """No room (``queue_full``, ``queue_wait``) or no compute slot in time (``queue_timeout``)."""

    def __init__(self, reason: str, retry_after_s: int = 1) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after_s = retry_after_s


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


class Admission:
    """Admission by expected wait, decided from the headers, plus the compute slots.

    ``admitted`` counts the requests taken and not yet finished: uploading, waiting for a slot,
    computing, or writing their answer. A newcomer would have ``admitted + 1 - slots`` requests
    ahead of it beyond the slots; it is refused when that count passes ``max_queue`` or when its
    expected wait, ``ahead x service time / slots``, passes ``target_wait_s``. The service time is
    a moving average of how long requests held a compute slot (0 until the first one finished, so a
    cold server admits by count alone). ``Retry-After`` on a refusal is the expected wait, rounded
    up, at least ``min_retry_after_s``.
    """

    def __init__(
        self,
        slots: int,
        max_queue: int,
        target_wait_s: float,
        queue_timeout_s: float,
        min_retry_after_s: int = 1,
        on_change: Callable[[int, int], None] | None = None,
    ) -> None:
        self.slots = slots
        self.max_queue = max_queue
        self.target_wait_s = target_wait_s
        self.min_retry_after_s = min_retry_after_s
        # Everyone admitted may wait for a slot: the count is bounded by admission, not by the gate.
        self.gate = AdmissionGate(slots, 1 << 30, queue_timeout_s, on_change)
        self.admitted = 0
        self.service_s = 0.0

    def expected_wait_s(self, extra: int = 1) -> float:
        """Expected wait for a slot of a request arriving now (``extra`` = 1) or of the last one admitted (0)."""
        ahead = self.admitted + extra - self.slots
        return ahead * self.service_s / self.slots if ahead > 0 else 0.0

    def retry_after_s(self) -> int:
        return max(self.min_retry_after_s, math.ceil(self.expected_wait_s()))

    def admit(self) -> None:
        """Count a request in, or raise :class:`Overloaded` (``queue_full`` or ``queue_wait``)."""
        ahead = self.admitted + 1 - self.slots
        if ahead > 0:
            if ahead > self.max_queue:
                raise Overloaded("queue_full", self.retry_after_s())
            if ahead * self.service_s / self.slots > self.target_wait_s:
                raise Overloaded("queue_wait", self.retry_after_s())
        self.admitted += 1

    def refusal(self, exc: Overloaded) -> str:
        """The message of a refused admission (:meth:`admit` raised ``exc``)."""
        return (
            f"the server is at capacity ({self.admitted} requests admitted for {self.slots} compute "
            f"slots, expected wait {self.expected_wait_s():.1f} s, target {self.target_wait_s:g} s); "
            f"retry after {exc.retry_after_s} s"
        )

    def leave(self) -> None:
        """The admitted request has ended."""
        self.admitted -= 1

    def record_service(self, seconds: float) -> None:
        """A request held a compute slot this long."""
        self.service_s = seconds if self.service_s == 0.0 else self.service_s + EWMA_WEIGHT * (seconds - self.service_s)

    @asynccontextmanager
    async def computing(self) -> AsyncIterator[float]:
        """Hold a compute slot (waiting in FIFO order for one); yields the seconds waited.

        Raises :class:`Overloaded` (``queue_timeout``) when no slot comes in time.
        """
        t0 = time.perf_counter()
        try:
            await self.gate.acquire()
        except Overloaded as exc:
            exc.retry_after_s = self.retry_after_s()
            raise
        t1 = time.perf_counter()
        try:
            yield t1 - t0
        finally:
            self.gate.release()
            self.record_service(time.perf_counter() - t1)
