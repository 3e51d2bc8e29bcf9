"""service.dataplane.scheduling: cheap work on the event loop, the rest in a worker thread holding a compute
slot, each prepared once and run under a memory lease.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from service.dataplane.admission import Admission
from service.dataplane.errors import Kind, ServiceError
from service.dataplane.memory import MemoryBudget, MemoryLease
from service.dataplane.scheduling import INLINE_MAX_RESPONSE_BYTES, Job, Scheduler


def scheduler(memory: MemoryBudget | None = None, slots: int = 1, queue_timeout_s: float = 5.0) -> Scheduler:
    admission = Admission(slots=slots, max_queue=8, target_wait_s=5.0, queue_timeout_s=queue_timeout_s)
    return Scheduler(admission, memory, inline_max_body_bytes=100, inline_max_work_flops=1e6)


class Work:
    """A job factory that records where it was prepared and run, and how often."""

    def __init__(self, flops: float = 0.0, response_bytes: int = 0, memory_bytes: int = 0) -> None:
        self.flops, self.response_bytes, self.memory_bytes = flops, response_bytes, memory_bytes
        self.prepared: list[int] = []
        self.held: list[int] = []

    def __call__(self) -> Job[int]:
        self.prepared.append(threading.get_ident())

        def run(lease: MemoryLease) -> int:
            self.held.append(lease.held)
            return threading.get_ident()

        return Job(self.flops, self.response_bytes, self.memory_bytes, run)


def on_loop_and_ran(s: Scheduler, size: int, work: Work) -> tuple[bool, bool]:
    async def main() -> tuple[bool, bool]:
        ran = await s.run(size, work)
        loop = threading.get_ident()
        return work.prepared[0] == loop, ran == loop

    return asyncio.run(main())


def test_a_tiny_body_with_cheap_work_stays_on_the_event_loop() -> None:
    assert on_loop_and_ran(scheduler(), 100, Work(flops=1e6, response_bytes=INLINE_MAX_RESPONSE_BYTES)) == (
        True,
        True,
    )


def test_a_large_body_is_prepared_and_run_in_a_thread() -> None:
    assert on_loop_and_ran(scheduler(), 101, Work()) == (False, False)


@pytest.mark.parametrize("work", [Work(flops=1e6 + 1), Work(response_bytes=INLINE_MAX_RESPONSE_BYTES + 1)])
def test_a_tiny_body_with_costly_work_runs_in_a_thread_prepared_once(work: Work) -> None:
    assert on_loop_and_ran(scheduler(), 10, work) == (True, False)
    assert len(work.prepared) == 1  # not parsed again in the thread


def test_the_work_holds_its_body_and_estimate_and_gives_them_back() -> None:
    memory = MemoryBudget(1 << 20, wait_s=0.0)
    work = Work(memory_bytes=1000)
    asyncio.run(scheduler(memory).run(500, work))
    assert work.held == [1500] and memory.reserved == 0
    inline = Work(memory_bytes=10)
    asyncio.run(scheduler(memory).run(20, inline))
    assert inline.held == [30] and memory.reserved == 0


def test_no_slot_in_time_is_unavailable_with_a_retry_hint() -> None:
    s = scheduler(slots=1, queue_timeout_s=0.05)
    release = threading.Event()

    def blocking() -> Job[None]:
        return Job(0.0, 0, 0, lambda lease: release.wait(5) and None)

    async def main() -> ServiceError:
        first = asyncio.create_task(s.run(1000, blocking))
        await asyncio.sleep(0.05)
        try:
            await s.run(1000, Work())
        except ServiceError as exc:
            return exc
        finally:
            release.set()
            await first
        raise AssertionError("the second request got a slot")

    error = asyncio.run(main())
    assert error.kind is Kind.UNAVAILABLE and error.retry_after_s is not None and error.retry_after_s >= 1
    assert "no compute slot became free within 0.05 s" in error.message


def test_a_cancelled_request_keeps_its_compute_slot_until_its_thread_ends() -> None:
    """A task cancelled while its work runs in a thread (a gRPC deadline, a client's cancel, a shutdown) holds its
    compute slot until the thread is done: the next request waits for it, it does not run beside it.
    """
    s = scheduler(slots=1)
    started, release = threading.Event(), threading.Event()
    first_done: list[float] = []  # appended when the first request's thread ends

    def slow() -> Job[str]:
        def run(lease: MemoryLease) -> str:
            started.set()
            release.wait(5)
            first_done.append(1.0)
            return "first"

        return Job(0.0, 0, 0, run)

    def second() -> Job[bool]:
        return Job(0.0, 0, 0, lambda lease: bool(first_done))  # True: the first thread had ended

    async def main() -> tuple[bool, bool]:
        task = asyncio.create_task(s.run(1000, slow))
        while not started.is_set():
            await asyncio.sleep(0.01)
        task.cancel()
        await asyncio.sleep(0.05)
        follower = asyncio.create_task(s.run(1000, second))
        await asyncio.sleep(0.2)
        waited = not follower.done()  # the slot is still held by the cancelled request's thread
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        return waited, await follower

    assert asyncio.run(main()) == (True, True)
