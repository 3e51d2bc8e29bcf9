"""The per-row kernel: row sums, entropy, max and argmax, exact zeros and attention distance, in float64 blocks.

The statistics are computed in one pass over the weights, in blocks of about :data:`BLOCK_ELEMENTS`
elements copied to float64, so the extra memory is a few blocks, never a full-size temporary. ``ln``
is evaluated in float32 for weights of at most 32 bits and in float64 otherwise.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

# Elements per float64 block (512 KiB): small enough to stay in cache, large
# enough that the per-block Python overhead is negligible.
BLOCK_ELEMENTS = 1 << 16
F64_MAX = float(np.finfo(np.float64).max)
F32, F64 = np.dtype(np.float32), np.dtype(np.float64)
TINY = {4: float(np.finfo(np.float32).tiny), 8: float(np.finfo(np.float64).tiny)}


@dataclass(slots=True)
class RowStats:
    """Per-row results of :func:`row_stats`, each of shape ``(G, L)``."""

    row_sum: np.ndarray
    entropy: np.ndarray
    max_weight: np.ndarray
    argmax: np.ndarray
    zero_count: np.ndarray  # exact zeros per row, non-finite weights excluded
    live: np.ndarray
    distance: np.ndarray | None
    non_finite: int
    bounded: bool = False
    """Every weight finite and within +-1e290: entropy and distance cannot overflow (no check needed)."""
    any_zeros: bool = True
    """Some weight is exactly 0 (else ``zero_count`` is all 0)."""


BOUND = 1e290  # |A| <= 1e290 over S <= 2**31 keys keeps sum A ln A and sum A |i - j| far below float64's max


def _blocks(groups: int, rows: int, keys: int) -> Iterator[tuple[slice, slice]]:
    """Cover a ``(groups, rows, keys)`` array with blocks of about ``BLOCK_ELEMENTS``.

    A block is either several whole groups (``rows`` slice is all rows) or a
    run of rows inside one group, so each block is contiguous in C order and
    its rows map onto one contiguous slice of the row positions.
    """
    per_block = max(1, BLOCK_ELEMENTS // max(keys, 1))
    if per_block >= rows:
        step = max(1, per_block // max(rows, 1))
        for g0 in range(0, groups, step):
            yield slice(g0, min(g0 + step, groups)), slice(0, rows)
    else:
        # Row-run outer, group inner: the distance block of a row run is built
        # once and reused for every group.
        for l0 in range(0, rows, per_block):
            for g in range(groups):
                yield slice(g, g + 1), slice(l0, min(l0 + per_block, rows))


@dataclass(slots=True)
class _Block:
    """Per-row results of one block of ``n`` rows (see :func:`_block_stats`)."""

    row_sum: np.ndarray
    entropy: np.ndarray
    max_weight: np.ndarray
    argmax: np.ndarray  # -1 for rows that are not live
    zero_count: np.ndarray
    live: np.ndarray
    non_finite: int
    bounded: bool
    any_zeros: bool


def _block_stats(src: np.ndarray, log_dtype: np.dtype, tiny: float) -> tuple[_Block, np.ndarray]:
    """Statistics of the rows of ``src`` ``(n, S)``, and the float64 rows they were computed from."""
    n, keys = src.shape
    # float64 rows for the reductions: a copy unless the input already is
    # float64 (then it is only read, and copied before any write).
    w2 = src if src.dtype == np.float64 else np.array(src, dtype=np.float64)
    s = np.einsum("ij->i", w2)
    # A sum is finite only if every term is, so one check covers the block.
    nf_rows: np.ndarray | None = None
    non_finite = 0
    if not np.isfinite(s).all():
        bad = ~np.isfinite(w2)
        nf_rows = np.count_nonzero(bad, axis=1)
        non_finite = int(nf_rows.sum())
        w2 = np.where(bad, 0.0, w2)
        s = np.einsum("ij->i", w2)
    # Clean blocks are read in their own dtype (cheaper, same result).
    base = src if nf_rows is None else w2
    lowest = float(base.min())
    has_zeros = not lowest > 0  # also true for negative weights
    if has_zeros:
        zeros = np.add.reduce(base == 0, axis=1, dtype=np.int64)
        is_live = zeros < keys
        if nf_rows is not None:
            zeros -= nf_rows
        am = np.where(is_live, base.argmax(axis=1), -1)
    else:
        zeros = np.zeros(n, np.int64)
        is_live = np.ones(n, bool)
        am = base.argmax(axis=1)
    mx = w2.max(axis=1)  # the value at the first maximum: exactly w2[i, argmax]
    bounded = nf_rows is None and -BOUND <= lowest and float(mx.max()) <= BOUND

    # Entropy: -sum A ln max(A, tiny); a zero weight contributes 0 * finite = 0.
    lg_src = base if base.dtype.itemsize <= log_dtype.itemsize else w2
    if has_zeros:
        lg = np.maximum(lg_src, tiny, dtype=log_dtype)
        np.log(lg, out=lg)
    else:
        lg = np.log(lg_src, dtype=log_dtype)
    h = np.einsum("ij,ij->i", w2, lg if lg.dtype == np.float64 else lg.astype(np.float64))
    np.negative(h, out=h)
    return _Block(s, h, mx, am, zeros, is_live, non_finite, bounded, has_zeros), w2


def distances(positions: np.ndarray, keys: int) -> np.ndarray:
    """``|positions_i - j|`` ``(L, S)`` for consecutive query positions; small ones are built once and cached."""
    rows = positions.size
    if rows * keys <= 4096:
        return _distance_table(rows, float(positions[0]) if rows else 0.0, keys)
    return np.abs(positions[:, None] - np.arange(keys, dtype=np.float64))


@functools.lru_cache(maxsize=128)
def _distance_table(rows: int, first: float, keys: int) -> np.ndarray:
    table = np.abs((np.arange(rows, dtype=np.float64) + first)[:, None] - np.arange(keys, dtype=np.float64))
    table.flags.writeable = False
    return table


def row_stats(a3: np.ndarray, positions: np.ndarray | None) -> RowStats:
    """Row statistics of ``a3`` ``(G, L, S)`` over its last axis.

    ``positions`` (``(L,)`` float64, the query positions) turns on the
    attention distance ``sum_j A_ij |positions_i - j|``. An input that fits
    one block (every request of a few thousand weights) is computed in one
    pass without the result buffers; larger ones block by block, with the
    same operations on each block, so both give the same numbers.
    """
    groups, rows, keys = a3.shape
    shape = (groups, rows)
    if keys == 0 or a3.size == 0:
        return RowStats(
            np.zeros(shape, np.float64),
            np.zeros(shape, np.float64),
            np.zeros(shape, np.float64),
            np.full(shape, -1, np.int64),
            np.zeros(shape, np.int64),
            np.zeros(shape, bool),
            np.zeros(shape, np.float64) if positions is not None else None,
            0,
        )
    # ln is evaluated in float32 for inputs of at most 32 bits (2-3 times faster,
    # relative error ~1e-7, below what such weights carry) and summed in float64.
    log_dtype = F32 if a3.dtype.itemsize <= 4 else F64
    tiny = TINY[log_dtype.itemsize]
    if a3.size <= BLOCK_ELEMENTS:
        blk, w2 = _block_stats(a3.reshape(groups * rows, keys), log_dtype, tiny)
        distance = None
        if positions is not None:
            distance = np.einsum("kls,ls->kl", w2.reshape(groups, rows, keys), distances(positions, keys))
        return RowStats(
            blk.row_sum.reshape(shape),
            blk.entropy.reshape(shape),
            blk.max_weight.reshape(shape),
            blk.argmax.reshape(shape),
            blk.zero_count.reshape(shape),
            blk.live.reshape(shape),
            distance,
            blk.non_finite,
            blk.bounded,
            blk.any_zeros,
        )

    row_sum = np.zeros(shape, np.float64)
    entropy = np.zeros(shape, np.float64)
    max_weight = np.zeros(shape, np.float64)
    argmax = np.full(shape, -1, np.int64)
    zero_count = np.zeros(shape, np.int64)
    live = np.zeros(shape, bool)
    distance_all = np.zeros(shape, np.float64) if positions is not None else None
    non_finite = 0
    key_pos = np.arange(keys, dtype=np.float64)
    dist_rows: slice | None = None
    dist_block = np.zeros((0, keys))
    for gs, ls in _blocks(groups, rows, keys):
        block = a3[gs, ls]
        k, m, _ = block.shape
        blk, w2 = _block_stats(block.reshape(k * m, keys), log_dtype, tiny)
        non_finite += blk.non_finite
        out = (gs, ls)
        row_sum[out] = blk.row_sum.reshape(k, m)
        entropy[out] = blk.entropy.reshape(k, m)
        max_weight[out] = blk.max_weight.reshape(k, m)
        argmax[out] = blk.argmax.reshape(k, m)
        zero_count[out] = blk.zero_count.reshape(k, m)
        live[out] = blk.live.reshape(k, m)
        if distance_all is not None and positions is not None:
            if dist_rows != ls:
                dist_block = np.abs(positions[ls, None] - key_pos[None, :])
                dist_rows = ls
            distance_all[out] = np.einsum("kls,ls->kl", w2.reshape(k, m, keys), dist_block)
    return RowStats(row_sum, entropy, max_weight, argmax, zero_count, live, distance_all, non_finite)


def to_finite(x: np.ndarray) -> np.ndarray:
    """Clamp to finite float64 in place (NaN -> 0, +-inf -> +-max)."""
    if np.isfinite(x).all():  # the usual case; nan_to_num costs ~10x more on small arrays
        return x
    clamped: np.ndarray = np.nan_to_num(x, copy=False, nan=0.0, posinf=F64_MAX, neginf=-F64_MAX)
    return clamped


def to_finite_scalar(x: float) -> float:
    """Clamp one float to a finite value (NaN -> 0, +-inf -> +-max)."""
    if math.isnan(x):
        return 0.0
    return max(-F64_MAX, min(F64_MAX, x))


def count_non_finite(x: np.ndarray) -> int:
    """Count NaN and +-inf entries of ``x`` without a full-size temporary."""
    if x.dtype.kind not in "fc":
        return 0
    if x.size <= BLOCK_ELEMENTS:
        return int(x.size - np.count_nonzero(np.isfinite(x)))
    flat = x.reshape(-1)
    bad = 0
    for i in range(0, flat.size, BLOCK_ELEMENTS):
        block = flat[i : i + BLOCK_ELEMENTS]
        bad += block.size - int(np.count_nonzero(np.isfinite(block)))
    return bad
