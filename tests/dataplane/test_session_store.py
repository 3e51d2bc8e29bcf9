"""The session store without a server: order within a sequence, eviction never of a session in use, idle sweeps,
ownership, and the refusals' words.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from service.dataplane.errors import Kind, ServiceError
from service.dataplane.memory import MemoryBudget
from service.dataplane.sessions.cache import Layout, Retention
from service.dataplane.sessions.store import SessionStore

LAYOUT = Layout(np.dtype(np.float32), batch=1, key_heads=1, head_size=4, value_size=4)
START = (LAYOUT, Retention(), 4)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def store(capacity: int = 1 << 20, clock: Clock | None = None, **kwargs: float) -> SessionStore:
    budget = MemoryBudget(1 << 30, wait_s=0)
    options = {"idle_s": 10.0, "max_positions": 1 << 16, "max_per_key": 8} | kwargs
    return SessionStore(budget.share(capacity, "session caches"), clock=clock or time.monotonic, **options)


def append(s: SessionStore, caller: str, sid: int | str, positions: int = 1, start: bool = False) -> None:
    with s.using(caller, sid, start=START if start else None) as (session, _):
        keys = np.zeros((1, 1, positions, 4), np.float32)
        session.cache.stage(keys, keys).commit()


def test_steps_of_one_sequence_run_one_at_a_time() -> None:
    s = store()
    append(s, "", 1, start=True)
    inside, overlaps = [0], [0]

    def stepper() -> None:
        for _ in range(50):
            with s.using("", 1):
                inside[0] += 1
                if inside[0] > 1:
                    overlaps[0] += 1
                time.sleep(0.0005)
                inside[0] -= 1

    threads = [threading.Thread(target=stepper) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert overlaps[0] == 0
    assert s.sessions[("", 1)].steps == 201


def test_a_session_with_a_step_in_flight_is_never_evicted() -> None:
    clock = Clock()
    s = store(capacity=64 * 32, clock=clock, idle_s=1.0)  # room for one cache of 64 positions of 32 bytes
    append(s, "", "busy", 16, start=True)
    with s.using("", "busy"):
        clock.now += 60
        assert s.sweep() == 0  # idle for a minute by its last step, but a step is in flight
        with pytest.raises(ServiceError) as refused:
            append(s, "", "other", 64, start=True)  # needs all the room: nothing idle to evict
        assert refused.value.kind is Kind.UNAVAILABLE
    assert s.sweep() == 0  # its step just ended: not idle
    clock.now += 1.5
    assert s.sweep() == 1
    assert "after 1.5 s without a step" in str(s.refusal("", "busy"))


def test_pressure_evicts_the_least_recently_used_idle_session_first() -> None:
    s = store(capacity=3 * 16 * 32)
    for name in ("a", "b", "c"):
        append(s, "", name, 16, start=True)
    append(s, "", "a", 0)  # "a" used most recently: "b" is now the least recently used
    append(s, "", "d", 16, start=True)
    assert set(k[1] for k in s.sessions) == {"a", "c", "d"}
    assert "to make room" in str(s.refusal("", "b"))


def test_sequences_are_the_callers_and_ids_keep_their_type() -> None:
    s = store()
    append(s, "key-one", 7, start=True)
    for caller, sid in (("key-two", 7), ("key-one", "7")):
        with pytest.raises(ServiceError, match="never started"):
            append(s, caller, sid)
    append(s, "key-one", 7)
    assert s.sessions[("key-one", 7)].cache.seen == 2


def test_a_refused_start_leaves_no_session() -> None:
    s = store()
    with pytest.raises(RuntimeError), s.using("", 9, start=START):
        raise RuntimeError("the step failed")
    assert s.sessions == {} and s.per_caller == {}
    assert "never started" in str(s.refusal("", 9))
