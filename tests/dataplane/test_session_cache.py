"""The session cache keeps exactly the positions its retention names, in order, through growth, eviction by a
window, compaction and rollback: checked against the plain list of every position appended.
"""

from __future__ import annotations

import numpy as np
import pytest

from service.dataplane.sessions.cache import KVCache, Layout, Retention

LAYOUT = Layout(np.dtype(np.float32), batch=2, key_heads=3, head_size=4, value_size=5)


def positions(start: int, m: int) -> tuple[np.ndarray, np.ndarray]:
    """Keys and values whose every element names its absolute position (so a kept block can be read back)."""
    idx = np.arange(start, start + m, dtype=np.float32)
    keys = np.broadcast_to(idx[None, None, :, None], (2, 3, m, 4)).copy()
    values = np.broadcast_to(-idx[None, None, :, None], (2, 3, m, 5)).copy()
    return keys, values


def expected(seen: int, retention: Retention) -> list[int]:
    if retention.window is None:
        return list(range(seen))
    sinks = list(range(min(retention.sinks, seen)))
    rest = list(range(len(sinks), seen))
    return sinks + rest[max(0, len(rest) - retention.window) :]


def kept(cache: KVCache) -> list[int]:
    keys, values = cache.view()
    assert np.array_equal(keys[..., 0], -values[..., 0])
    return [int(x) for x in keys[0, 0, :, 0]]


@pytest.mark.parametrize(
    "retention", [Retention(), Retention(window=7, sinks=0), Retention(window=5, sinks=3), Retention(window=1, sinks=4)]
)
def test_random_steps_keep_what_the_retention_names(retention: Retention) -> None:
    rng = np.random.default_rng(0)
    held: list[int] = []
    cache = KVCache(LAYOUT, retention, max_positions=10_000, reserve=held.append)
    seen = 0
    for _ in range(200):
        m = int(rng.choice([1, 1, 1, 2, 3, 9, 20]))
        staged = cache.stage(*positions(seen, m))
        if rng.random() < 0.2:
            staged.rollback()
        else:
            staged.commit()
            seen += m
        assert cache.seen == seen
        assert kept(cache) == expected(seen, retention)
        assert cache.length == cache.kept_after(0)
        for p in (0, 1, 3, 4, 6, seen):
            assert cache.below(p) == sum(1 for x in expected(seen, retention) if x < p)
    assert sum(held) == cache.nbytes
    if retention.window is not None:
        assert cache.capacity <= retention.sinks + 2 * retention.window


def test_growth_is_amortised() -> None:
    """Appending one position at a time reallocates O(log n) times, not every step."""
    grown: list[int] = []
    cache = KVCache(LAYOUT, Retention(), max_positions=5000, reserve=grown.append)
    for i in range(4096):
        cache.stage(*positions(i, 1)).commit()
    assert len(grown) <= 10
    assert cache.capacity == 4096


def test_a_window_moves_the_sinks_not_the_window() -> None:
    """A windowed step copies the sinks over the dropped positions; the window stays where it is in the buffer."""
    cache = KVCache(LAYOUT, Retention(window=100, sinks=4), max_positions=10_000, reserve=lambda n: None)
    cache.stage(*positions(0, 104)).commit()
    cache.stage(*positions(104, 1)).commit()  # grows the buffers to their largest (sinks + 2 * window)
    assert cache.capacity == 204
    keys_before, start = cache.keys, cache.start
    window_before = cache.view()[0][:, :, 4:].copy()
    cache.stage(*positions(105, 1)).commit()
    assert cache.keys is keys_before
    assert cache.start == start + 1
    assert np.array_equal(cache.view()[0][:, :, 4:-1], window_before[:, :, 1:])
