"""One session's key/value cache: the positions it keeps, in order, in buffers that grow without copying the
whole cache every step.

A sequence appends key and value positions step by step. Without a window the cache keeps every position; with
one (StreamingLLM, Xiao et al. 2023) it keeps the sequence's first ``sinks`` positions and its last ``window``
others. The kept positions always lie contiguous and in the sequence's order in the buffers, at
``[start, stop)``, so a step's attention reads them as one array (the same array a stateless request over the
kept positions sends, hence the same numbers).

Growth and eviction copy little:

- the buffers double when an append does not fit (amortised: each position is copied O(1) times), up to
  ``sinks + 2 * window`` with a window, or ``max_positions`` without; when the budget has no room to double, they
  grow by what the step needs;
- a window drops its oldest positions by moving the sinks, not the window: the sinks move forward over the
  dropped positions (``sinks`` positions copied, not ``window``), and the kept block is moved back to the
  buffers' start only when an append reaches their end (once per ``window`` positions appended).

:meth:`KVCache.stage` appends a step's positions and returns a :class:`Staged` step: :meth:`Staged.commit` keeps
them, :meth:`Staged.rollback` restores the cache as it was (a step refused after its append, an overflow in its
scores, leaves no trace). The cache is not thread-safe: its session's lock orders the steps.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from service.dataplane.errors import ServiceError


@dataclass(frozen=True, slots=True)
class Layout:
    """What a sequence fixes at its start: the cache's dtype and the shape of a position."""

    dtype: np.dtype
    batch: int
    key_heads: int
    head_size: int
    value_size: int

    def describe(self) -> str:
        return (
            f"{self.dtype.name}, batch {self.batch}, {self.key_heads} key heads, head size {self.head_size}, "
            f"value size {self.value_size}"
        )

    def position_bytes(self) -> int:
        """Bytes one position takes in the buffers (its keys and values, every batch and key head)."""
        return self.batch * self.key_heads * (self.head_size + self.value_size) * self.dtype.itemsize


@dataclass(frozen=True, slots=True)
class Retention:
    """Which positions a cache keeps: all (``window`` None), or the first ``sinks`` and the last ``window``."""

    window: int | None = None
    sinks: int = 0

    def kept(self, seen: int) -> tuple[int, int]:
        """(sinks kept, window kept) once ``seen`` positions were appended."""
        sinks = min(self.sinks, seen) if self.window is not None else 0
        rest = seen - sinks
        return sinks, rest if self.window is None else min(self.window, rest)


Reserve = Callable[[int], None]
"""Holds more bytes for the buffers on the sessions' budget, or raises (the store's: it may evict to make room)."""
Release = Callable[[int], None]


class KVCache:
    """The kept keys and values of one sequence (module docstring)."""

    def __init__(self, layout: Layout, retention: Retention, max_positions: int, reserve: Reserve) -> None:
        self.layout = layout
        self.retention = retention
        self.max_capacity = (
            max_positions if retention.window is None else min(max_positions, retention.sinks + 2 * retention.window)
        )
        self.keys, self.values = self._buffers(0)
        self.start = self.stop = 0
        self.seen = 0
        """Positions appended in all (kept or not)."""
        self._reserve = reserve

    def _buffers(self, capacity: int) -> tuple[np.ndarray, np.ndarray]:
        """Empty key and value buffers of ``capacity`` positions."""
        lay = self.layout
        return (
            np.empty((lay.batch, lay.key_heads, capacity, lay.head_size), dtype=lay.dtype),
            np.empty((lay.batch, lay.key_heads, capacity, lay.value_size), dtype=lay.dtype),
        )

    @property
    def capacity(self) -> int:
        return int(self.keys.shape[2])

    @property
    def length(self) -> int:
        """Positions kept."""
        return self.stop - self.start

    @property
    def nbytes(self) -> int:
        """Bytes the buffers hold (what the cache has reserved)."""
        return self.capacity * self.layout.position_bytes()

    def kept_after(self, appended: int) -> int:
        """The positions kept once ``appended`` more are appended."""
        return sum(self.retention.kept(self.seen + appended))

    def view(self) -> tuple[np.ndarray, np.ndarray]:
        """The kept keys (B, Hkv, n, E) and values (B, Hkv, n, Ev), in the sequence's order (views, not copies)."""
        return self.keys[:, :, self.start : self.stop], self.values[:, :, self.start : self.stop]

    def below(self, position: int) -> int:
        """How many kept positions lie before the sequence's position ``position`` (they are the first kept)."""
        sinks, window = self.retention.kept(self.seen)
        window_start = self.seen - window
        return min(position, sinks) + max(0, min(position, self.seen) - window_start)

    def _fit(self, appended: int) -> None:
        """Room for ``appended`` more positions after ``stop``: the kept block moved to the start, or the buffers
        grown (doubling, within ``max_capacity``; the new bytes reserved first, the old released by the caller).
        """
        if self.stop + appended <= self.capacity:
            return
        n = self.length
        if n + appended <= self.capacity:  # move the kept block back to the start
            self.keys[:, :, :n] = self.keys[:, :, self.start : self.stop]
            self.values[:, :, :n] = self.values[:, :, self.start : self.stop]
            self.start, self.stop = 0, n
            return
        capacity = min(self.max_capacity, max(2 * self.capacity, n + appended, 16))
        try:
            self._reserve((capacity - self.capacity) * self.layout.position_bytes())
        except ServiceError:  # no room to double: grow by what this step needs (refused in turn when it has none)
            if capacity == n + appended:
                raise
            capacity = n + appended
            self._reserve((capacity - self.capacity) * self.layout.position_bytes())
        keys, values = self._buffers(capacity)
        keys[:, :, :n] = self.keys[:, :, self.start : self.stop]
        values[:, :, :n] = self.values[:, :, self.start : self.stop]
        self.keys, self.values, self.start, self.stop = keys, values, 0, n

    def stage(self, key: np.ndarray, value: np.ndarray) -> Staged:
        """Append a step's keys (B, Hkv, m, E) and values (B, Hkv, m, Ev), dropping what the window no longer keeps
        (the caller checked their layout, and that the positions kept fit ``max_capacity``).
        """
        m = key.shape[2]
        seen = self.seen + m
        sinks, window = self.retention.kept(seen)
        if self.length + m > self.max_capacity:  # a window's step longer than the room the buffers may have
            return self._replace(key, value, sinks, window)
        self._fit(m)
        before = (self.start, self.stop, self.seen)
        self.keys[:, :, self.stop : self.stop + m] = key
        self.values[:, :, self.stop : self.stop + m] = value
        self.stop += m
        self.seen = seen
        dropped = self.length - sinks - window  # after the sinks, oldest first: the sinks move over them
        if dropped <= 0:
            return Staged(self, before, None)
        region = slice(self.start, self.start + sinks + dropped)
        saved = (region, self.keys[:, :, region].copy(), self.values[:, :, region].copy())
        to = slice(self.start + dropped, self.start + dropped + sinks)
        self.keys[:, :, to] = self.keys[:, :, self.start : self.start + sinks]
        self.values[:, :, to] = self.values[:, :, self.start : self.start + sinks]
        self.start += dropped
        return Staged(self, before, saved)

    def _replace(self, key: np.ndarray, value: np.ndarray, sinks: int, window: int) -> Staged:
        """A step that does not fit beside the kept positions (a prompt longer than the window): the kept
        positions of old and new together, in new buffers of the largest capacity.
        """
        keys = np.concatenate([self.keys[:, :, self.start : self.stop], key], axis=2)
        values = np.concatenate([self.values[:, :, self.start : self.stop], value], axis=2)
        keep = [slice(0, sinks), slice(keys.shape[2] - window, keys.shape[2])]
        capacity = self.max_capacity
        if capacity > self.capacity:
            self._reserve((capacity - self.capacity) * self.layout.position_bytes())
        old = (self.keys, self.values, self.start, self.stop, self.seen)
        self.keys, self.values = self._buffers(capacity)
        self.keys[:, :, : sinks + window] = np.concatenate([keys[:, :, k] for k in keep], axis=2)
        self.values[:, :, : sinks + window] = np.concatenate([values[:, :, k] for k in keep], axis=2)
        self.start, self.stop, self.seen = 0, sinks + window, self.seen + key.shape[2]
        return Staged(self, (old[2], old[3], old[4]), None, buffers=(old[0], old[1]))


class Staged:
    """A step's positions appended to a cache, until the step's answer is known (module docstring)."""

    __slots__ = ("_before", "_buffers", "_cache", "_saved")

    def __init__(
        self,
        cache: KVCache,
        before: tuple[int, int, int],
        saved: tuple[slice, np.ndarray, np.ndarray] | None,
        *,
        buffers: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> None:
        self._cache = cache
        self._before = before
        self._saved = saved
        self._buffers = buffers

    def commit(self) -> None:
        """Keep the step's positions."""
        self._saved = self._buffers = None

    def rollback(self) -> None:
        """The cache as it was before the step (its buffers may stay grown)."""
        cache = self._cache
        if self._buffers is not None:  # the buffers were replaced (they stay as large: their bytes stay reserved)
            keys, values = self._buffers
            n = self._before[1] - self._before[0]
            cache.keys[:, :, :n] = keys[:, :, self._before[0] : self._before[1]]
            cache.values[:, :, :n] = values[:, :, self._before[0] : self._before[1]]
            cache.start, cache.stop, cache.seen = 0, n, self._before[2]
            return
        if self._saved is not None:
            region, keys, values = self._saved
            cache.keys[:, :, region] = keys
            cache.values[:, :, region] = values
        cache.start, cache.stop, cache.seen = self._before
