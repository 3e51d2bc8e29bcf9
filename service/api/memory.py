"""A process-wide budget of estimated bytes in flight, and the per-request lease that holds part of it.

Every request's CPU work runs under a :class:`MemoryLease` (``wire.run_cpu`` opens one and closes it
when the work is done). When the work knows its estimate (``budget.enforce`` after the shapes are
parsed, before anything large is allocated), it reserves those bytes on the lease: at once when
the budget has room, otherwise after waiting up to ``wait_s`` for requests in flight to finish
(then 503 with ``Retry-After``). So N concurrent requests, each within the limits, cannot together
exceed the budget; a request larger than the whole budget is refused with 413 before it waits.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from service.api.errors import ProblemError


class MemoryBudget:
    """Bytes reserved by the requests in flight, at most ``capacity``. Thread-safe."""

    def __init__(self, capacity: int, wait_s: float, retry_after_s: int = 1) -> None:
        self.capacity = capacity
        self.wait_s = wait_s
        self.retry_after_s = retry_after_s
        self.reserved = 0
        self._cond = threading.Condition()

    def acquire(self, nbytes: int, *, wait: bool = True) -> None:
        """Reserve ``nbytes``: 413 if it can never fit, 503 if no room came within ``wait_s``."""
        if nbytes > self.capacity:
            raise ProblemError(
                413,
                f"estimated memory {_mib(nbytes)} exceeds this server's budget of {_mib(self.capacity)} "
                "(ATTN_MEMORY_BUDGET_BYTES); split the request (fewer batches or heads, shorter sequences) "
                "or ask for fewer outputs",
            )
        deadline = time.monotonic() + (self.wait_s if wait else 0.0)
        with self._cond:
            while self.reserved + nbytes > self.capacity:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ProblemError(
                        503,
                        f"the server's memory budget is in use ({_mib(self.reserved)} of {_mib(self.capacity)} "
                        f"reserved by requests in flight; this one needs {_mib(nbytes)}); retry later",
                        headers={"Retry-After": str(self.retry_after_s)},
                    )
                self._cond.wait(left)
            self.reserved += nbytes

    def release(self, nbytes: int) -> None:
        """Give back ``nbytes`` and wake the requests waiting for room."""
        if nbytes <= 0:
            return
        with self._cond:
            self.reserved = max(0, self.reserved - nbytes)
            self._cond.notify_all()


class MemoryLease:
    """What one request holds of a :class:`MemoryBudget`; released all at once when the request ends."""

    def __init__(self, budget: MemoryBudget, *, wait: bool = True) -> None:
        self.budget = budget
        self.wait = wait
        self.held = 0

    def reserve(self, nbytes: int) -> None:
        """Hold ``nbytes`` more (see :meth:`MemoryBudget.acquire`)."""
        nbytes = int(nbytes)
        if nbytes <= 0:
            return
        self.budget.acquire(nbytes, wait=self.wait)
        self.held += nbytes

    def release(self) -> None:
        self.budget.release(self.held)
        self.held = 0


_LEASE: ContextVar[MemoryLease | None] = ContextVar("attn_memory_lease", default=None)


def current_lease() -> MemoryLease | None:
    """The lease of the request whose work runs in this context, if any."""
    return _LEASE.get()


@contextmanager
def leased(budget: MemoryBudget | None, *, wait: bool = True) -> Iterator[MemoryLease | None]:
    """Run a request's work under a fresh lease of ``budget`` (nothing when ``budget`` is None)."""
    if budget is None:
        yield None
        return
    lease = MemoryLease(budget, wait=wait)
    token = _LEASE.set(lease)
    try:
        yield lease
    finally:
        _LEASE.reset(token)
        lease.release()


def _mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:.1f} MiB"
