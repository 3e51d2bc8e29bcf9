"""A process-wide budget of estimated bytes in flight, the per-request lease that holds part of it, and the
C heap's free memory given back after large requests.

Every request's CPU work runs under a :class:`MemoryLease` (the scheduler opens one and closes it when
the work is done). The work reserves its estimate on the lease before anything large is allocated: at
once when the budget has room, otherwise after waiting up to ``wait_s`` for requests in flight to finish
(then ``UNAVAILABLE`` with a retry hint). So N concurrent requests, each within the limits, cannot
together exceed the budget; a request larger than the whole budget is ``TOO_LARGE`` before it waits.

A front end that holds request bodies while they wait (REST reads a body before its work has a compute
slot) reserves them too, when it admits the request, through a :class:`BudgetShare`: on the same budget,
without waiting, and within a share of it, so that bodies waiting for a slot never take all the room the
work in progress needs. It tells the scheduler how much of the body is already held, so the bytes are
reserved once.

:func:`release_after` gives the C heap's free memory back to the operating system after a request that
held a large body ends, whatever its answer (glibc keeps freed blocks below its mmap threshold, up to
32 MiB each, in the heap: eight refused 30 MB uploads left a worker at 800 MB), and after any requests
once the process has been quiet for a second (:class:`HeapTrimmer`).
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Callable

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


TRIM_AFTER_BODY_BYTES = 4 << 20
"""A request whose body (on the wire or inflated) reached this size has its freed memory given back when it ends."""
TRIM_INTERVAL_S = 1.0
"""At most one trim per this many seconds (each walks the heap: a few milliseconds of one core)."""
TRIM_IDLE_S = 1.0
"""After this long with no request ending, the free heap that the requests before left is given back."""

_trim_logger = logging.getLogger("service")


class HeapTrimmer:
    """Runs ``release`` (``malloc_trim``) in a thread of its own: soon when asked (:meth:`request`), at most once
    per ``interval_s``, requests made while one is pending merged into it; and once the process has been quiet
    for ``idle_s`` after requests ended (:meth:`ended`).

    Under load, glibc keeps the heap's free memory: many requests at once raise its high-water mark, and
    fragmentation keeps most of it from going back (on a 60 s load test RSS rose in steps from 188 to 240
    MiB while the Python objects traced did not grow). Trimming under load stalls the threads that allocate
    meanwhile (one trim took up to 20 ms), so the quiet moment after it is when that memory goes back.
    """

    def __init__(
        self, release: Callable[[], None], interval_s: float = TRIM_INTERVAL_S, idle_s: float = TRIM_IDLE_S
    ) -> None:
        self._release = release
        self._interval_s = interval_s
        self._idle_s = idle_s
        self._wanted = threading.Event()
        self._soon = False
        self._idle_pending = False
        self._last_end = 0.0
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.trims = 0

    def request(self) -> None:
        """Ask for a trim soon (never blocks)."""
        self._soon = True
        self._wake()

    def ended(self) -> None:
        """A request ended: trim once no other one has ended for ``idle_s`` (never blocks; a clock read and a
        flag while one is already pending).
        """
        self._last_end = time.monotonic()
        if not self._idle_pending:
            self._idle_pending = True
            self._wake()

    def _wake(self) -> None:
        self._wanted.set()
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, name="heap-trim", daemon=True)
                    self._thread.start()

    def _run(self) -> None:
        last = 0.0
        while True:
            self._wanted.wait()
            self._wanted.clear()
            if not self._soon:  # after requests ended: wait for a quiet moment (a request asking meanwhile goes first)
                while not self._soon and (quiet := self._last_end + self._idle_s - time.monotonic()) > 0:
                    self._wanted.wait(quiet)
                    self._wanted.clear()
            pause = last + self._interval_s - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            self._wanted.clear()  # what asked during the pause is served by this trim
            self._soon = False
            self._idle_pending = False  # a request ending from here on asks for the next idle trim
            try:
                self._release()
            except Exception:  # never let a trim end the thread
                _trim_logger.exception("giving the C heap's free memory back failed")
            self.trims += 1
            last = time.monotonic()


def _release_free_heap() -> None:
    """Collect garbage, then trim the C heap. A request that ended in an error can leave its body in a reference
    cycle (the exception's traceback holds the frames that hold the body): a collection frees it first (it walks
    only what was allocated since the start-up heap was frozen, ``ATTN_GC_FREEZE``).
    """
    from service.engines.onnx_engine.heap import release_free_heap  # glibc malloc_trim(0); a no-op elsewhere

    gc.collect()
    release_free_heap()


HEAP_TRIMMER = HeapTrimmer(_release_free_heap)
"""The process's trimmer (the C heap is the process's)."""


def release_after(nbytes: int) -> None:
    """A request that held ``nbytes`` of body has ended: trim the heap soon when that was large, and in any case
    once the process is quiet (:meth:`HeapTrimmer.ended`).
    """
    if nbytes >= TRIM_AFTER_BODY_BYTES:
        HEAP_TRIMMER.request()
    else:
        HEAP_TRIMMER.ended()
