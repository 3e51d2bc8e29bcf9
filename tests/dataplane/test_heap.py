"""When the heap trimmer gives the C heap's free memory back: soon after a large request, and once the process
is quiet after ordinary ones, never while requests keep ending; its thread ends when its app stops.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from service.dataplane.heap import TRIM_AFTER_BODY_BYTES, HeapTrimmer


class Releases:
    def __init__(self) -> None:
        self.times: list[float] = []
        self.event = threading.Event()

    def __call__(self) -> None:
        self.times.append(time.monotonic())
        self.event.set()

    def wait_until(self, seen: Callable[[float], bool], timeout: float) -> bool:
        """True once a release ran at a time ``seen`` accepts (False after ``timeout`` seconds)."""
        deadline = time.monotonic() + timeout
        while not any(seen(t) for t in list(self.times)):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.005)
        return True


def test_a_request_for_a_trim_runs_soon() -> None:
    releases = Releases()
    trimmer = HeapTrimmer(releases, interval_s=0.05, idle_s=10.0)
    trimmer.request()
    assert releases.event.wait(2.0)
    assert trimmer.trims == 1


def test_requests_during_the_pause_between_trims_are_merged_into_the_next() -> None:
    releases = Releases()
    trimmer = HeapTrimmer(releases, interval_s=0.5, idle_s=30.0)
    trimmer.request()
    assert releases.event.wait(2.0)
    releases.event.clear()
    trimmer.request()  # the next trim waits for the interval: these three share it
    time.sleep(0.1)
    trimmer.request()
    trimmer.request()
    assert releases.event.wait(2.0)
    time.sleep(0.8)  # past another interval: no trim was left pending
    assert trimmer.trims == 2


def test_ended_requests_trim_once_the_process_is_quiet() -> None:
    """Requests end every 10 ms for a second: no trim while they do, one 0.5 s after the last. Each time is taken
    right after its ``ended()`` (a sleep that overran on a busy machine once put the "last end" 10 ms late), and a
    trim during the load is allowed only after a gap of 0.5 s between two ends (a scheduler stall, not the load).
    """
    releases = Releases()
    trimmer = HeapTrimmer(releases, interval_s=0.0, idle_s=0.5)
    ends: list[float] = []
    start = time.monotonic()
    while not ends or ends[-1] - start < 1.0:  # never quiet for 0.5 s, unless the machine stalls this thread
        trimmer.ended()
        ends.append(time.monotonic())
        time.sleep(0.01)
    last_end = ends[-1]
    assert releases.wait_until(lambda t: t >= last_end, 2.0)
    during = [t for t in releases.times if t < last_end]
    for trim in during:  # only after a quiet moment
        before = max(e for e in ends if e < trim)
        assert trim - before >= 0.49, (trim - before, during)
    assert releases.times[len(during)] - last_end >= 0.49  # after the quiet moment, not during the load
    time.sleep(0.7)
    assert len(releases.times) == len(during) + 1  # once: nothing ended since


def test_a_request_during_the_quiet_wait_goes_first() -> None:
    releases = Releases()
    trimmer = HeapTrimmer(releases, interval_s=0.0, idle_s=30.0)
    trimmer.ended()
    time.sleep(0.05)
    assert releases.times == []
    trimmer.request()
    assert releases.event.wait(2.0)


def test_ended_after_a_trim_asks_for_the_next_one() -> None:
    releases = Releases()
    trimmer = HeapTrimmer(releases, interval_s=0.0, idle_s=0.05)
    trimmer.ended()
    assert releases.event.wait(2.0)
    releases.event.clear()
    trimmer.ended()
    assert releases.event.wait(2.0)
    assert trimmer.trims == 2


def test_a_large_body_asks_for_a_trim_and_a_small_one_waits_for_quiet() -> None:
    releases = Releases()
    trimmer = HeapTrimmer(releases, interval_s=0.0, idle_s=30.0)
    trimmer.release_after(TRIM_AFTER_BODY_BYTES - 1)
    time.sleep(0.05)
    assert releases.times == []  # ordinary: once the process has been quiet for idle_s
    trimmer.release_after(TRIM_AFTER_BODY_BYTES)
    assert releases.event.wait(2.0)


def test_close_ends_the_thread_and_a_later_request_starts_another() -> None:
    releases = Releases()
    trimmer = HeapTrimmer(releases, interval_s=0.0, idle_s=30.0)
    before = set(threading.enumerate())
    trimmer.request()
    assert releases.event.wait(2.0)
    (thread,) = [t for t in threading.enumerate() if t not in before and t.name == "heap-trim"]
    trimmer.close()
    thread.join(1.0)
    assert not thread.is_alive() and trimmer.trims == 1
    releases.event.clear()
    trimmer.request()
    assert releases.event.wait(2.0)
    assert trimmer.trims == 2
    trimmer.close()
