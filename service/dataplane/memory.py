"""A data plane's budget of estimated bytes in flight, and the per-request lease that holds part of it.

Every request's CPU work runs under a :class:`MemoryLease` (the scheduler opens one and closes it when
the work is done). The work reserves its estimate on the lease before anything large is allocated: at
once when the budget has room, otherwise after waiting up to ``wait_s`` for requests in flight to finish
(then ``UNAVAILABLE`` with a retry hint). So N concurrent requests, each within the limits, cannot
together exceed the budget; a request larger than the whole budget is ``TOO_LARGE`` before it waits.

A front end that holds request bodies while they wait (REST reads a body before its work has a compute
slot) reserves them too, when it admits the request, through a :class:`BudgetShare`: on the same budget,
without waiting, and within a share of it, so that bodies waiting for a slot never take all the room the
work in progress needs. It tells the scheduler how much of the body is already held, so the bytes are
reserved once. When a request ends, what it freed goes back to the operating system (:mod:`.heap`).
"""

from __future__ import annotations

import threading
import time

from service.dataplane.errors import too_large, unavailable


def mib(nbytes: int) -> str:
    """``12.5 MiB``: a byte count as messages write it."""
    return f"{nbytes / 2**20:.1f} MiB"


def over_budget_message(nbytes: int, capacity: int) -> str:
    """Why a request whose own estimate exceeds the whole budget is refused."""
    return (
        f"estimated memory {mib(nbytes)} exceeds this server's budget of {mib(capacity)} "
        "(ATTN_MEMORY_BUDGET_BYTES); split the request (fewer batches or heads, shorter sequences) "
        "or ask for fewer outputs"
    )


class MemoryBudget:
    """Bytes reserved by the requests in flight, at most ``capacity``. Thread-safe."""

    def __init__(self, capacity: int, wait_s: float, retry_after_s: int = 1) -> None:
        self.capacity = capacity
        self.wait_s = wait_s
        self.retry_after_s = retry_after_s
        self.reserved = 0
        self._cond = threading.Condition()

    def acquire(self, nbytes: int, *, wait: bool = True) -> None:
        """Reserve ``nbytes``: ``TOO_LARGE`` if it can never fit, ``UNAVAILABLE`` if no room came within
        ``wait_s`` (at once without ``wait``).
        """
        if nbytes > self.capacity:
            raise too_large(over_budget_message(nbytes, self.capacity))
        deadline = time.monotonic() + (self.wait_s if wait else 0.0)
        with self._cond:
            while self.reserved + nbytes > self.capacity:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise unavailable(
                        f"the server's memory budget is in use ({mib(self.reserved)} of {mib(self.capacity)} "
                        f"reserved by requests in flight; this one needs {mib(nbytes)}); retry later",
                        self.retry_after_s,
                    )
                self._cond.wait(left)
            self.reserved += nbytes

    def try_acquire(self, nbytes: int) -> bool:
        """Reserve ``nbytes`` at once if the budget has room; False (nothing reserved) if not."""
        with self._cond:
            if self.reserved + nbytes > self.capacity:
                return False
            self.reserved += nbytes
            return True

    def share(self, limit: int, holders: str) -> BudgetShare:
        """A share of this budget that ``holders`` (e.g. "request bodies") may take at most."""
        return BudgetShare(self, limit, holders)

    def release(self, nbytes: int) -> None:
        """Give back ``nbytes`` and wake the requests waiting for room."""
        if nbytes <= 0:
            return
        with self._cond:
            self.reserved = max(0, self.reserved - nbytes)
            self._cond.notify_all()

    def lease(self, *, wait: bool = True) -> MemoryLease:
        """A new, empty lease of this budget."""
        return MemoryLease(self, wait=wait)


class BudgetShare:
    """Part of a :class:`MemoryBudget` that one kind of holder may take at most (``limit`` bytes): what it holds
    is reserved on the budget as well, never waiting (``UNAVAILABLE`` at once when there is no room, in the
    share or in the budget). Thread-safe.
    """

    def __init__(self, budget: MemoryBudget, limit: int, holders: str) -> None:
        self.budget = budget
        self.capacity = min(limit, budget.capacity)
        self.holders = holders
        self.reserved = 0
        self._lock = threading.Lock()

    @property
    def retry_after_s(self) -> int:
        return self.budget.retry_after_s

    def refusal(self, nbytes: int) -> str:
        """Why ``nbytes`` found no room."""
        return (
            f"the server's memory is in use: {self.holders} hold {mib(self.reserved)} of the "
            f"{mib(self.capacity)} they may take, requests in flight {mib(self.budget.reserved)} of "
            f"{mib(self.budget.capacity)} in all; this one needs {mib(nbytes)}; "
            f"retry after {self.budget.retry_after_s} s"
        )

    def acquire(self, nbytes: int, *, wait: bool = False) -> None:
        """Reserve ``nbytes`` in the share and on the budget, or raise ``UNAVAILABLE`` (``wait`` is ignored)."""
        with self._lock:
            if self.reserved + nbytes > self.capacity or not self.budget.try_acquire(nbytes):
                raise unavailable(self.refusal(nbytes), self.budget.retry_after_s)
            self.reserved += nbytes

    def release(self, nbytes: int) -> None:
        if nbytes <= 0:
            return
        with self._lock:
            self.reserved = max(0, self.reserved - nbytes)
        self.budget.release(nbytes)

    def lease(self) -> MemoryLease:
        """A new, empty lease of this share."""
        return MemoryLease(self, wait=False)


class MemoryLease:
    """What one request holds of a :class:`MemoryBudget`; released all at once when the request ends
    (use it as a context manager).
    """

    __slots__ = ("budget", "held", "wait")

    def __init__(self, budget: MemoryBudget | BudgetShare | None, *, wait: bool = True) -> None:
        self.budget = budget
        self.wait = wait
        self.held = 0

    def reserve(self, nbytes: int) -> None:
        """Hold ``nbytes`` more (see :meth:`MemoryBudget.acquire`); nothing without a budget."""
        nbytes = int(nbytes)
        if nbytes <= 0 or self.budget is None:
            return
        self.budget.acquire(nbytes, wait=self.wait)
        self.held += nbytes

    def settle(self, nbytes: int) -> None:
        """Hold exactly ``nbytes`` where more was reserved for what was not yet known (a gRPC message reserves the
        largest a message may be while it arrives, then its size): the surplus goes back at once.
        """
        surplus = self.held - max(0, int(nbytes))
        if surplus > 0 and self.budget is not None:
            self.budget.release(surplus)
            self.held -= surplus

    def release(self) -> None:
        if self.budget is not None:
            self.budget.release(self.held)
        self.held = 0

    def __enter__(self) -> MemoryLease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
