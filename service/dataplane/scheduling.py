"""Where a request's CPU work runs: on the event loop when it is cheap, else in a worker thread holding a
compute slot; always under a lease of the memory budget.

A front end hands the scheduler a ``prepare`` function (decode the wire form, check it, estimate its
cost: a :class:`Job`) and the body's size. Cheap work costs less than the hop to a worker thread and
back, so a small body is prepared on the event loop, and its job runs there too when its estimate is
small (work at most ``inline_max_work_flops``, an answer of at most 64 KiB); any other job runs in a
worker thread, once it holds one of the admission's compute slots (``UNAVAILABLE`` when none comes in
time). A large body is prepared in the thread as well: parsing it is work too. By body size alone, a
2 KB request can hold the loop for tens of milliseconds (bisection entmax over a long key axis), hence
the second look at the estimate.

The work reserves the body's bytes and the job's memory estimate on a lease of the process-wide budget
(:mod:`service.dataplane.memory`) before it runs, and gives all of it back when it ends. Work on the
event loop never waits for room. A front end that already holds the body's bytes on the budget (REST
reserves the declared length when it admits a request, before the body is read) says how many with
``reserved_bytes``: those are not reserved again.

Work in a thread cannot be stopped: a request whose task is cancelled while its work runs (a gRPC
deadline or cancel, the end of a shutdown grace) keeps its compute slot until the thread ends
(:func:`until_done`), so abandoned work never runs beside the slots' count of new work.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, Protocol, TypeVar

import anyio.to_thread

from service.dataplane.admission import Admission, Overloaded
from service.dataplane.errors import unavailable
from service.dataplane.memory import MemoryBudget, MemoryLease

T = TypeVar("T")
U = TypeVar("U")

INLINE_MAX_RESPONSE_BYTES = 64 << 10
"""A job run on the event loop must also have a small answer (serializing it is loop time too)."""


class Job(Generic[T]):
    """Checked work with its estimates: GEMM-equivalent flops, response bytes, memory bytes to reserve
    before it runs; ``run(lease)`` does it (and may reserve more on the lease: an engine's own memory).
    """

    __slots__ = ("flops", "memory_bytes", "response_bytes", "run")

    def __init__(self, flops: float, response_bytes: int, memory_bytes: int, run: Callable[[MemoryLease], T]) -> None:
        self.flops = flops
        self.response_bytes = response_bytes
        self.memory_bytes = memory_bytes
        self.run = run

    def then(self, finish: Callable[[T], U]) -> Job[U]:
        """The job followed by ``finish`` on its result (a front end's encoding), with the same estimates."""
        run = self.run
        return Job(self.flops, self.response_bytes, self.memory_bytes, lambda lease: finish(run(lease)))


class SchedulerObserver(Protocol):
    """What the scheduler reports (the metrics implement it)."""

    def queue_waited(self, seconds: float) -> None: ...

    def refused(self, reason: str) -> None: ...


async def until_done(work: Awaitable[T]) -> T:
    """Await ``work`` (a worker thread's); when the awaiting task is cancelled, first wait for the work to end,
    then re-raise. A thread cannot be stopped, and anyio's ``to_thread.run_sync`` lets a task's own cancellation
    (``Task.cancel()``: a gRPC deadline or a client's cancel, a server's shutdown) through at once: the compute
    slot around it would be given back while the thread still computes, and abandoned work would pile up.
    """
    future = asyncio.ensure_future(work)
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        while not future.done():
            try:
                await asyncio.wait({future})
            except asyncio.CancelledError:  # cancelled again: the work still runs, and still holds its slot
                continue
        if not future.cancelled():
            future.exception()  # its outcome is dropped with the call, not logged as never retrieved
        raise


class Scheduler:
    """Runs jobs inline or in worker threads (module docstring); one per process, shared by the front ends."""

    def __init__(
        self,
        admission: Admission | None,
        memory: MemoryBudget | None,
        *,
        inline_max_body_bytes: int = 0,
        inline_max_work_flops: float = 0.0,
        observer: SchedulerObserver | None = None,
    ) -> None:
        self.admission = admission
        self.memory = memory
        self.inline_max_body_bytes = inline_max_body_bytes
        self.inline_max_work_flops = inline_max_work_flops
        self.observer = observer

    async def run(
        self,
        body_bytes: int,
        prepare: Callable[[], Job[T]],
        *,
        reserved_bytes: int = 0,
        waited: Callable[[float], None] | None = None,
    ) -> T:
        """Prepare and run one request's work (module docstring); its result, or the error it raised.

        ``reserved_bytes``: how much of the body the front end already holds on the memory budget; ``waited``
        is told how long the work waited for a compute slot (not called for work run on the event loop).
        """
        unreserved = max(0, body_bytes - reserved_bytes)
        if body_bytes <= self.inline_max_body_bytes:
            job = prepare()
            if job.flops <= self.inline_max_work_flops and job.response_bytes <= INLINE_MAX_RESPONSE_BYTES:
                with MemoryLease(self.memory, wait=False) as lease:
                    lease.reserve(unreserved + job.memory_bytes)
                    return job.run(lease)
            return await self.in_thread(body_bytes, lambda: job, reserved_bytes=reserved_bytes, waited=waited)
        return await self.in_thread(body_bytes, prepare, reserved_bytes=reserved_bytes, waited=waited)

    async def in_thread(
        self,
        body_bytes: int,
        prepare: Callable[[], Job[T]],
        *,
        reserved_bytes: int = 0,
        waited: Callable[[float], None] | None = None,
    ) -> T:
        """Prepare and run the work in a worker thread, holding a compute slot (``reserved_bytes``, ``waited``: see
        :meth:`run`).
        """
        unreserved = max(0, body_bytes - reserved_bytes)

        def work() -> T:
            with MemoryLease(self.memory) as lease:
                lease.reserve(unreserved)
                job = prepare()
                lease.reserve(job.memory_bytes)
                return job.run(lease)

        admission = self.admission
        if admission is None:
            return await anyio.to_thread.run_sync(work)
        try:
            async with admission.computing() as seconds:
                if self.observer is not None:
                    self.observer.queue_waited(seconds)
                if waited is not None:
                    waited(seconds)
                # Not abandoned on cancellation: the slot stays held until the thread's work really ends.
                return await until_done(anyio.to_thread.run_sync(work))
        except Overloaded as exc:
            if self.observer is not None:
                self.observer.refused(exc.reason)
            raise unavailable(
                f"no compute slot became free within {admission.gate.queue_timeout_s:g} s; "
                f"retry after {exc.retry_after_s} s",
                exc.retry_after_s,
            ) from None

    async def hold_slot(self, seconds: float) -> None:
        """Hold a compute slot for ``seconds`` (``ATTN_DEBUG_DELAY_S``, a test setting: slow work)."""
        if self.admission is None:
            await asyncio.sleep(seconds)
            return
        try:
            async with self.admission.computing():
                await asyncio.sleep(seconds)
        except Overloaded as exc:
            if self.observer is not None:
                self.observer.refused(exc.reason)
            raise unavailable(f"retry after {exc.retry_after_s} s", exc.retry_after_s) from None
