"""Admission without a server (issue 29 item 5): who gets in (by count and by expected wait), the refusal's words
and retry-after, and the compute slots' FIFO order and timeout.
"""

from __future__ import annotations

import asyncio

import pytest

from service.dataplane.admission import Admission, AdmissionGate, Overloaded


def test_admits_by_count_beyond_the_slots() -> None:
    admission = Admission(slots=2, max_queue=1, target_wait_s=5.0, queue_timeout_s=1.0)
    for _ in range(3):  # two computing, one queued
        admission.admit()
    with pytest.raises(Overloaded) as err:
        admission.admit()
    assert err.value.reason == "queue_full" and admission.admitted == 3
    admission.leave()
    admission.admit()  # room again
    assert admission.admitted == 3


def test_admits_by_expected_wait_and_says_when_to_retry() -> None:
    admission = Admission(slots=1, max_queue=100, target_wait_s=2.0, queue_timeout_s=10.0, min_retry_after_s=1)
    admission.record_service(1.5)  # a request holds the slot 1.5 s
    admission.admit()  # computing
    admission.admit()  # one ahead: 1.5 s expected
    assert admission.expected_wait_s() == pytest.approx(3.0)  # a newcomer would have two ahead
    with pytest.raises(Overloaded) as err:
        admission.admit()
    assert err.value.reason == "queue_wait" and err.value.retry_after_s == 3
    assert admission.refusal(err.value) == (
        "the server is at capacity (2 requests admitted for 1 compute slots, expected wait 3.0 s, target 2 s); "
        "retry after 3 s"
    )


def test_the_service_time_is_a_moving_average() -> None:
    admission = Admission(slots=1, max_queue=1, target_wait_s=1.0, queue_timeout_s=1.0)
    admission.record_service(1.0)
    admission.record_service(2.0)
    assert admission.service_s == pytest.approx(1.2)  # 1 + 0.2 * (2 - 1)


def test_the_gate_serves_in_order_and_times_out() -> None:
    async def scenario() -> tuple[list[int], str]:
        gate = AdmissionGate(1, 8, queue_timeout_s=0.2)
        order: list[int] = []
        await gate.acquire()

        async def waiter(i: int) -> None:
            await gate.acquire()
            order.append(i)
            gate.release()

        tasks = [asyncio.create_task(waiter(i)) for i in range(3)]
        await asyncio.sleep(0.01)
        gate.release()
        await asyncio.gather(*tasks)
        await gate.acquire()  # held: the next one waits past its timeout
        try:
            await gate.acquire()
        except Overloaded as exc:
            return order, exc.reason
        return order, ""

    order, reason = asyncio.run(scenario())
    assert order == [0, 1, 2] and reason == "queue_timeout"
