"""Attention diagnostics (semantics.md, "Diagnostics").

Pure numpy and standard library. The per-row statistics are computed in one
pass over the weights, in blocks of about ``_BLOCK_ELEMENTS`` elements copied
to float64, so the extra memory is a few blocks, never a full-size temporary.
All reductions run in float64; ``ln`` is evaluated in float32 for weights of at
most 32 bits (relative error ~1e-7, below what such weights carry) and in
float64 otherwise. Small inputs (``B * Hq * L * S + 16 * B * Hq * L <= 384``)
take a path in plain Python over lists instead (:func:`_small_diagnostics`):
numpy's per-call overhead (~60 calls of ~1 us) dominates them. Both paths give
the same results but for the order of float sums (a few ulps).

Definitions (``A`` the weights of one query row, ``S`` the key count, ``n`` the
row's ``valid_keys``):

* *live* row: at least one finite non-zero weight. Otherwise the row is *fully
  masked*: masked out completely, or a relu row whose relu sum is 0.
* *informative* row: live and ``n >= 2``. Only informative rows can be
  collapsed, uniform or saturated (with one valid key the only distribution is
  one-hot, which says nothing about the model).
* Non-finite weights (NaN, +-inf) are counted in ``non_finite`` and read as 0
  by every other statistic, so every float in the result is finite.
* ``entropy`` ``H = -sum_j A_j ln A_j`` in nats, ``0 ln 0 = 0``, clipped below
  at 0 (weights rounded just above 1); 0 for fully masked rows.
* ``normalized_entropy`` ``H / ln n`` for informative rows, else 0.
* ``effective_support`` ``exp(H)`` for live rows, else 0.
* ``max_weight`` and ``argmax`` (first index of the max; -1 when fully masked).
* ``zeros``: valid keys whose weight is exactly 0, computed as
  ``#{j : A_j == 0} - (S - n)`` clipped to ``[0, n]``; masked keys are exactly 0
  by contract, so this is the sparsity of sparse normalizers (softmax: 0 unless
  exp underflows; a relu zero-sum row: ``n``; a masked-out row: 0).
* ``attention_distance`` ``sum_j A_j |p - j|`` with query position ``p = i``, or
  ``i + S - L`` when ``causal == "bottom_right"``.
"""

from __future__ import annotations

import functools
import itertools
import math
import operator
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "DiagnosticThresholds",
    "attention_diagnostics",
    "probability_diagnostics",
]

# Elements per float64 block (512 KiB): small enough to stay in cache, large
# enough that the per-block Python overhead is negligible.
_BLOCK_ELEMENTS = 1 << 16
_F64_MAX = float(np.finfo(np.float64).max)
_CAUSAL = (None, "top_left", "bottom_right")
_F32, _F64 = np.dtype(np.float32), np.dtype(np.float64)
_TINY = {4: float(np.finfo(np.float32).tiny), 8: float(np.finfo(np.float64).tiny)}


@dataclass(frozen=True, slots=True)
class DiagnosticThresholds:
    """Thresholds of the per-head flags and of saturation (settings ``ATTN_DIAG_*``).

    * ``collapsed_max_weight`` (0.9): an informative row *collapses* when its max
      weight is ``>=`` this, i.e. at least 90 % of its mass sits on one key.
    * ``collapsed_row_fraction`` (0.5): a head is ``collapsed`` when strictly
      more than this fraction of its informative rows collapse ("most rows").
    * ``uniform_normalized_entropy`` (0.95): a head is ``uniform`` when the mean
      normalized entropy of its informative rows is ``>=`` this (1 is exactly
      uniform; 0.95 still means the head barely discriminates between keys).
    * ``saturation_margin`` (1e-6, semantics.md): an informative row is
      *saturated* when its max weight is ``> 1 - margin``: softmax gradients
      through it are then below ~1e-6 and vanish.
    """

    collapsed_max_weight: float = 0.9
    collapsed_row_fraction: float = 0.5
    uniform_normalized_entropy: float = 0.95
    saturation_margin: float = 1e-6

    def __post_init__(self) -> None:
        """Reject values outside the ranges where the flags make sense."""
        checks = (
            ("collapsed_max_weight", self.collapsed_max_weight, 0.0, 1.0, False),
            ("collapsed_row_fraction", self.collapsed_row_fraction, 0.0, 1.0, True),
            ("uniform_normalized_entropy", self.uniform_normalized_entropy, 0.0, 1.0, False),
            ("saturation_margin", self.saturation_margin, 0.0, 1.0, False),
        )
        for name, value, low, high, low_closed in checks:
            v = float(value)
            ok = (low <= v if low_closed else low < v) and v <= high
            if not ok:
                left = "[" if low_closed else "("
                raise ValueError(f"{name} must be in {left}{low}, {high}], got {value!r}")


# --------------------------------------------------------------------------
# The per-row kernel
# --------------------------------------------------------------------------


@dataclass(slots=True)
class _RowStats:
    """Per-row results of :func:`_row_stats`, each of shape ``(G, L)``."""

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


_BOUND = 1e290  # |A| <= 1e290 over S <= 2**31 keys keeps sum A ln A and sum A |i - j| far below float64's max


def _blocks(groups: int, rows: int, keys: int) -> Iterator[tuple[slice, slice]]:
    """Cover a ``(groups, rows, keys)`` array with blocks of about ``_BLOCK_ELEMENTS``.

    A block is either several whole groups (``rows`` slice is all rows) or a
    run of rows inside one group, so each block is contiguous in C order and
    its rows map onto one contiguous slice of the row positions.
    """
    per_block = max(1, _BLOCK_ELEMENTS // max(keys, 1))
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
    bounded = nf_rows is None and -_BOUND <= lowest and float(mx.max()) <= _BOUND

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


def _distances(positions: np.ndarray, keys: int) -> np.ndarray:
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


def _row_stats(a3: np.ndarray, positions: np.ndarray | None) -> _RowStats:
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
        return _RowStats(
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
    log_dtype = _F32 if a3.dtype.itemsize <= 4 else _F64
    tiny = _TINY[log_dtype.itemsize]
    if a3.size <= _BLOCK_ELEMENTS:
        blk, w2 = _block_stats(a3.reshape(groups * rows, keys), log_dtype, tiny)
        distance = None
        if positions is not None:
            distance = np.einsum("kls,ls->kl", w2.reshape(groups, rows, keys), _distances(positions, keys))
        return _RowStats(
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
    return _RowStats(row_sum, entropy, max_weight, argmax, zero_count, live, distance_all, non_finite)


def _finite(x: np.ndarray) -> np.ndarray:
    """Clamp to finite float64 in place (NaN -> 0, +-inf -> +-max)."""
    if np.isfinite(x).all():  # the usual case; nan_to_num costs ~10x more on small arrays
        return x
    clamped: np.ndarray = np.nan_to_num(x, copy=False, nan=0.0, posinf=_F64_MAX, neginf=-_F64_MAX)
    return clamped


def _finite_scalar(x: float) -> float:
    """Clamp one float to a finite value (NaN -> 0, +-inf -> +-max)."""
    if math.isnan(x):
        return 0.0
    return max(-_F64_MAX, min(_F64_MAX, x))


def _count_non_finite(x: np.ndarray) -> int:
    """Count NaN and +-inf entries of ``x`` without a full-size temporary."""
    if x.dtype.kind not in "fc":
        return 0
    if x.size <= _BLOCK_ELEMENTS:
        return int(x.size - np.count_nonzero(np.isfinite(x)))
    flat = x.reshape(-1)
    bad = 0
    for i in range(0, flat.size, _BLOCK_ELEMENTS):
        block = flat[i : i + _BLOCK_ELEMENTS]
        bad += block.size - int(np.count_nonzero(np.isfinite(block)))
    return bad


# --------------------------------------------------------------------------
# Score statistics
# --------------------------------------------------------------------------


def _moments(flat: np.ndarray, scale: float) -> tuple[int, float, float, float, float]:
    """Count, min, max, mean and population variance of the finite entries.

    Blocks are merged with Chan's parallel update; values are multiplied by
    ``scale`` (a power of two, so exactly) before the mean and variance.
    """
    n = 0
    lo, hi = math.inf, -math.inf
    mean = 0.0
    m2 = 0.0
    for i in range(0, flat.size, _BLOCK_ELEMENTS):
        x = flat[i : i + _BLOCK_ELEMENTS]
        fin = np.isfinite(x)
        v = x.astype(np.float64) if fin.all() else x[fin].astype(np.float64)
        nb = v.size
        if nb == 0:
            continue
        # the ufuncs' reductions themselves (v.min(), v.mean() wrap them in Python: same numbers)
        lo = min(lo, float(np.minimum.reduce(v)))
        hi = max(hi, float(np.maximum.reduce(v)))
        if scale != 1.0:
            v *= scale
        mb = float(np.add.reduce(v)) / nb
        v -= mb
        m2b = float(np.einsum("i,i->", v, v))
        total = n + nb
        delta = mb - mean
        mean += delta * nb / total
        m2 += m2b + delta * delta * (n * nb / total)
        n = total
    var = m2 / n if n else 0.0
    return n, lo, hi, mean, var


def _score_stats(scores: np.ndarray) -> dict[str, Any] | None:
    """``min``/``max``/``mean``/``std`` (population) and ``count`` of the finite scores."""
    flat = scores.reshape(-1)
    if flat.size == 0 or flat.dtype.kind not in "iuf":
        return None
    with np.errstate(over="ignore", invalid="ignore"):  # overflow is detected just below and redone scaled
        n, lo, hi, mean, var = _moments(flat, 1.0)
    if n == 0:
        return None
    if not (math.isfinite(mean) and math.isfinite(var)):
        # Only for float64 scores beyond ~1e154: redo with an exact power-of-two
        # scale that brings every value into [-1, 1].
        exponent = math.frexp(max(abs(lo), abs(hi)))[1]
        n, lo, hi, mean, var = _moments(flat, math.ldexp(1.0, -exponent))
        mean = math.ldexp(mean, exponent)
        std = math.ldexp(math.sqrt(max(var, 0.0)), exponent) if var > 0 else 0.0
    else:
        std = math.sqrt(max(var, 0.0))
    return {
        "min": _finite_scalar(lo),
        "max": _finite_scalar(hi),
        "mean": _finite_scalar(mean),
        "std": _finite_scalar(std),
        "count": int(n),
    }


# --------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------


def attention_diagnostics(
    weights: np.ndarray,
    valid_keys: np.ndarray,
    *,
    scores: np.ndarray | None = None,
    output: np.ndarray | None = None,
    causal: str | None = None,
    thresholds: DiagnosticThresholds = DiagnosticThresholds(),
) -> dict[str, Any]:
    """Diagnostics of attention weights ``(B, Hq, L, S)``; see the module docstring.

    ``valid_keys`` (broadcastable to ``(B, Hq, L)``) is the number of keys each
    row may attend; ``scores`` (same shape as ``weights``, masked = -inf) feeds
    ``score_stats``; ``output`` is only checked for non-finite values;
    ``causal`` (None, ``"top_left"``, ``"bottom_right"``) sets the query
    positions of ``attention_distance``.

    Per-row arrays, shape ``(B, Hq, L)``: ``entropy``, ``normalized_entropy``,
    ``max_weight``, ``effective_support``, ``attention_distance`` (float64),
    ``argmax``, ``zeros`` (int64). Scalars: ``fully_masked_rows``,
    ``saturated_rows`` (informative rows with max weight > 1 - margin),
    ``non_finite`` (weights, plus output if given) (int),
    ``row_sum_max_error`` (max ``|sum A - 1|`` over live rows, 0.0 if none),
    ``score_stats`` (``min``, ``max``, ``mean``, population ``std`` (float) and
    ``count`` (int) of the finite scores; None without scores or finite ones).

    ``heads``: one dict per (batch, head), C order: ``batch``, ``head``,
    ``mean_entropy`` and ``mean_distance`` (over live rows),
    ``mean_normalized_entropy`` (over informative rows), ``collapsed``,
    ``uniform`` (bool), ``live_rows``, ``informative_rows`` (int) and
    ``collapsed_fraction`` (float). Means over no rows are 0.0 and a head with
    no informative row is neither collapsed nor uniform.
    """
    w = np.asarray(weights)
    if w.ndim != 4:
        raise ValueError(f"weights must be 4-D (B, Hq, L, S), got shape {w.shape}")
    if w.dtype.kind != "f":
        raise ValueError(f"weights must be floating point, got {w.dtype}")
    batch, heads, rows, keys = w.shape
    shape = (batch, heads, rows)
    nv = np.asarray(valid_keys)
    if nv.shape != shape:
        try:
            nv = np.broadcast_to(nv, shape)
        except ValueError as exc:
            raise ValueError(f"valid_keys of shape {np.shape(valid_keys)} does not broadcast to {shape}") from exc
    # clip to [0, keys] in int64 (np.clip's Python wrapper costs more than the two ufuncs on small arrays)
    nv = np.minimum(np.maximum(nv if nv.dtype == np.int64 else nv.astype(np.int64), 0), keys)
    if scores is not None and np.shape(scores) != w.shape:
        raise ValueError(f"scores shape {np.shape(scores)} differs from weights shape {w.shape}")
    if causal not in _CAUSAL:
        raise ValueError(f"causal must be None, 'top_left' or 'bottom_right', got {causal!r}")

    offset = keys - rows if causal == "bottom_right" else 0
    if w.dtype in _SMALL_DTYPES and 0 < w.size and w.size + _ROW_WORK * (w.size // keys) <= _SMALL_WORK:
        small = _small_diagnostics(w, nv, scores, output, offset, thresholds)
        if small is not None:
            return small
    st = _row_stats(w.reshape(batch * heads, rows, keys), _positions(rows, offset))
    live = st.live.reshape(shape)
    finite = (lambda x: x) if st.bounded else _finite  # bounded weights give finite sums: nothing to clamp
    entropy = np.where(live, np.maximum(finite(st.entropy.reshape(shape)), 0.0), 0.0)
    max_weight = finite(st.max_weight.reshape(shape))
    argmax = st.argmax.reshape(shape)
    distance = finite(st.distance.reshape(shape)) if st.distance is not None else np.zeros(shape)
    informative = live & (nv >= 2)

    # ln n >= ln 2 (no division by zero); exp overflows only past entropy 709, which weights
    # summing to 1 cannot reach: the error state is set only when it can.
    log_n = np.log(np.maximum(nv, 2, dtype=np.float64))
    normalized = np.where(informative, entropy / log_n, 0.0)
    if entropy.size and float(entropy.max()) > 700.0:
        with np.errstate(over="ignore"):
            support = np.where(live, _finite(np.exp(entropy)), 0.0)
    else:
        support = np.where(live, np.exp(entropy), 0.0)
    if st.any_zeros:
        zeros = np.minimum(np.maximum(st.zero_count.reshape(shape) - (keys - nv), 0), nv)
    else:  # no zero weight: 0 - (keys - nv) <= 0 clips to 0 everywhere
        zeros = np.zeros(shape, np.int64)

    row_err = np.abs(st.row_sum.reshape(shape) - 1.0)
    n_live = int(np.count_nonzero(live))
    if n_live == live.size:
        row_sum_max_error = _finite_scalar(float(np.maximum.reduce(row_err, axis=None)))
    else:
        row_sum_max_error = _finite_scalar(float(row_err[live].max())) if n_live else 0.0
    saturated = informative & (max_weight > 1.0 - thresholds.saturation_margin)
    non_finite = st.non_finite
    if output is not None:
        non_finite += _count_non_finite(np.asarray(output))

    head_list = _heads(entropy, normalized, distance, max_weight, live, informative, thresholds)
    return {
        "entropy": entropy,
        "normalized_entropy": normalized,
        "max_weight": max_weight,
        "argmax": argmax,
        "effective_support": support,
        "zeros": zeros,
        "attention_distance": distance,
        "heads": head_list,
        "fully_masked_rows": live.size - n_live,
        "row_sum_max_error": row_sum_max_error,
        "non_finite": int(non_finite),
        "saturated_rows": int(np.count_nonzero(saturated)),
        "score_stats": _score_stats(np.asarray(scores)) if scores is not None else None,
    }


@functools.lru_cache(maxsize=256)
def _positions(rows: int, offset: int) -> np.ndarray:
    """Query positions ``i + offset`` as float64 (read-only: shared by every call with these sizes)."""
    positions = np.arange(rows, dtype=np.float64) + offset
    positions.flags.writeable = False
    return positions


def _heads(
    entropy: np.ndarray,
    normalized: np.ndarray,
    distance: np.ndarray,
    max_weight: np.ndarray,
    live: np.ndarray,
    informative: np.ndarray,
    thresholds: DiagnosticThresholds,
) -> list[dict[str, Any]]:
    """Per-(batch, head) summaries, C order; all-masked heads get 0 and False.

    The six per-row quantities summed per head are stacked and reduced in one
    call (each sum runs over its own contiguous rows, as six separate sums would).
    ``entropy`` is already 0 off live rows and ``normalized`` off informative ones.
    """
    collapsed_rows = informative & (max_weight >= thresholds.collapsed_max_weight)
    stacked = np.array(
        (entropy, np.where(live, distance, 0.0), normalized, live, informative, collapsed_rows), np.float64
    )
    sums = stacked.sum(axis=-1)  # (6, B, H); the counts are exact in float64
    counts = sums[3:].astype(np.int64)
    divisors = np.maximum(counts[:2], 1)
    means = _finite(sums[:3] / divisors[[0, 0, 1]])  # entropy and distance over live rows, normalized over informative
    fraction = sums[5] / divisors[1]
    n_live, n_info, _ = counts.tolist()
    mean_entropy, mean_distance, mean_normalized = means.tolist()
    fractions = fraction.tolist()
    collapsed_above = thresholds.collapsed_row_fraction
    uniform_above = thresholds.uniform_normalized_entropy
    result: list[dict[str, Any]] = []
    batch, heads = live.shape[:2]
    for b in range(batch):
        for h in range(heads):
            info = n_info[b][h]
            result.append(
                {
                    "batch": b,
                    "head": h,
                    "mean_entropy": mean_entropy[b][h],
                    "mean_normalized_entropy": mean_normalized[b][h],
                    "mean_distance": mean_distance[b][h],
                    "collapsed": info > 0 and fractions[b][h] > collapsed_above,
                    "uniform": info > 0 and mean_normalized[b][h] >= uniform_above,
                    "live_rows": n_live[b][h],
                    "informative_rows": info,
                    "collapsed_fraction": fractions[b][h],
                }
            )
    return result


# --------------------------------------------------------------------------
# Small inputs: plain Python over lists
# --------------------------------------------------------------------------

_SMALL_WORK = 384
"""Inputs with ``weights + 16 * rows <= 384`` (``B * Hq * L * S`` weights, ``B * Hq * L`` rows) take the list path.

The numpy path costs ~80 us whatever the size (about 60 numpy calls at ~1 us each
on tiny arrays); the list path ~20 us plus ~2 us per row and ~0.15 us per weight
(scores included). ``bench/bench_diagnostics.py`` measured the list path faster
(1.1-3x) at every shape under this line, e.g. (1, 1, 4, 4), (1, 2, 8, 8),
(1, 1, 4, 64), and slower (0.9x or less) above it, e.g. (1, 1, 16, 16), (1, 1, 32, 4).
"""
_ROW_WORK = 16
_SMALL_DTYPES = (_F32, _F64)


def _small_diagnostics(
    w: np.ndarray,
    nv: np.ndarray,
    scores: np.ndarray | None,
    output: np.ndarray | None,
    offset: int,
    thresholds: DiagnosticThresholds,
) -> dict[str, Any] | None:
    """:func:`attention_diagnostics` of small float32/float64 weights, in plain Python over lists.

    It exists because numpy's per-call overhead dominates tiny inputs (a (1, 1, 4, 4)
    request spends ~90 us in ~60 numpy calls). Same result as the numpy path: the
    same types and shapes, and the same values but for the order of the float
    sums (entropy, distance, row sums, head means: within a few ulps). ``ln``
    and ``exp`` are still numpy's (one call each over all weights), so they are
    evaluated with the same precision (float32 ``ln`` for float32 weights).
    ``nv`` is ``valid_keys`` already broadcast and clipped to ``[0, S]``.
    Returns None (use the numpy path) for finite weights beyond +-1e290, whose
    sums may overflow.
    """
    batch, heads, rows, keys = w.shape
    flat = w.reshape(-1, keys)
    ws: list[list[float]] = flat.tolist()
    # Non-finite weights are counted and read as 0 (a finite sum means finite terms).
    bad_rows: dict[int, int] = {}
    if not math.isfinite(sum(map(sum, ws))):
        for r, row in enumerate(ws):
            bad = keys - sum(map(math.isfinite, row))
            if bad:
                ws[r] = [x if math.isfinite(x) else 0.0 for x in row]
                bad_rows[r] = bad
    lowest = min(map(min, ws))
    mxs: list[float] = list(map(max, ws))
    if not (-_BOUND <= lowest and max(mxs) <= _BOUND):
        return None
    # ln as _block_stats takes it: max(A, tiny) in the log dtype when some weight is <= 0, else ln A.
    log_dtype = _F32 if w.dtype.itemsize <= 4 else _F64
    if bad_rows or not lowest > 0:
        lg = np.log(np.maximum(flat, _TINY[log_dtype.itemsize], dtype=log_dtype))
    else:
        lg = np.log(flat, dtype=log_dtype)
    lgs: list[list[float]] = lg.tolist()
    for r in bad_rows:  # NaN / inf logs of the weights read as 0
        lgs[r] = [x if math.isfinite(x) else 0.0 for x in lgs[r]]
    valid: list[int] = nv.reshape(-1).tolist()
    log_n = _log_valid(keys)
    dist = _distance_lists(rows, offset, keys)
    saturated_above = 1.0 - thresholds.saturation_margin
    collapsed_at = thresholds.collapsed_max_weight
    collapsed_above = thresholds.collapsed_row_fraction
    uniform_above = thresholds.uniform_normalized_entropy

    zcs: list[int] = list(map(list.count, ws, itertools.repeat(0.0)))  # exact zeros, non-finite weights included
    own_zeros = zcs if not bad_rows else [zc - bad_rows.get(r, 0) for r, zc in enumerate(zcs)]
    # per row: entropy, normalized entropy, distance, live (1.0 / 0.0), argmax, zeros
    ent: list[float] = []
    norm: list[float] = []
    dis: list[float] = []
    live_f: list[float] = []
    ams: list[int] = []
    zer: list[int] = []
    ent_append, norm_append, dis_append = ent.append, norm.append, dis.append
    live_append, am_append, zer_append = live_f.append, ams.append, zer.append
    mul = operator.mul
    row_err = 0.0
    n_live_all = n_saturated = 0
    head_list: list[dict[str, Any]] = []
    r = 0
    for g in range(batch * heads):
        sum_ent = sum_dist = sum_norm = 0.0
        n_live = n_info = n_collapsed = 0
        for i in range(rows):
            n = valid[r]
            z = own_zeros[r] + n - keys
            zer_append(0 if z <= 0 else (n if z > n else z))
            if zcs[r] < keys:  # live
                row = ws[r]
                mx = mxs[r]
                am_append(row.index(mx))
                h = -sum(map(mul, row, lgs[r]))
                if not h > 0.0:
                    h = 0.0
                d = sum(map(mul, row, dist[i]))
                err = abs(sum(row) - 1.0)
                if err > row_err:
                    row_err = err
                n_live += 1
                sum_ent += h
                sum_dist += d
                live_append(1.0)
                if n >= 2:  # informative
                    ne = h / log_n[n]
                    n_info += 1
                    sum_norm += ne
                    if mx >= collapsed_at:
                        n_collapsed += 1
                    if mx > saturated_above:
                        n_saturated += 1
                else:
                    ne = 0.0
            else:
                am_append(-1)
                live_append(0.0)
                h = ne = d = 0.0
            ent_append(h)
            norm_append(ne)
            dis_append(d)
            r += 1
        n_live_all += n_live
        mean_norm = sum_norm / (n_info or 1)
        fraction = n_collapsed / (n_info or 1)
        head_list.append(
            {
                "batch": g // heads,
                "head": g % heads,
                "mean_entropy": sum_ent / (n_live or 1),
                "mean_normalized_entropy": mean_norm,
                "mean_distance": sum_dist / (n_live or 1),
                "collapsed": n_info > 0 and fraction > collapsed_above,
                "uniform": n_info > 0 and mean_norm >= uniform_above,
                "live_rows": n_live,
                "informative_rows": n_info,
                "collapsed_fraction": fraction,
            }
        )

    shape = (batch, heads, rows)
    floats = np.array((ent, norm, mxs, dis, live_f), np.float64).reshape((5, *shape))
    ints = np.array((ams, zer), np.int64).reshape((2, *shape))
    entropy = floats[0]
    if max(ent) > 700.0:  # only negative weights get there: exp overflows, clamped as the numpy path does
        with np.errstate(over="ignore"):
            support = _finite(np.exp(entropy))
    else:
        support = np.exp(entropy)
    support *= floats[4]  # 0 off live rows
    non_finite = sum(bad_rows.values())
    if output is not None:
        non_finite += _count_non_finite(np.asarray(output))
    return {
        "entropy": entropy,
        "normalized_entropy": floats[1],
        "max_weight": floats[2],
        "argmax": ints[0],
        "effective_support": support,
        "zeros": ints[1],
        "attention_distance": floats[3],
        "heads": head_list,
        "fully_masked_rows": len(ws) - n_live_all,
        "row_sum_max_error": row_err,
        "non_finite": non_finite,
        "saturated_rows": n_saturated,
        "score_stats": _small_score_stats(np.asarray(scores)) if scores is not None else None,
    }


def _small_score_stats(scores: np.ndarray) -> dict[str, Any] | None:
    """:func:`_score_stats` of few float32/float64 scores over a list (others go to :func:`_score_stats`).

    The mean and the centred sum of squares are taken as :func:`_moments` takes them
    for one block; only the order of the sums differs.
    """
    if scores.dtype not in _SMALL_DTYPES:
        return _score_stats(scores)
    values = list(filter(math.isfinite, scores.reshape(-1).tolist()))
    n = len(values)
    if n == 0:
        return None
    block_mean = sum(values) / n
    var = sum([(x - block_mean) * (x - block_mean) for x in values]) / n
    mean = 0.0 + block_mean * n / n  # the block merged into an empty total, as _moments does
    if not (math.isfinite(mean) and math.isfinite(var)):
        return _score_stats(scores)  # beyond ~1e154: the numpy path rescales
    return {"min": min(values), "max": max(values), "mean": mean, "std": math.sqrt(max(var, 0.0)), "count": n}


@functools.lru_cache(maxsize=128)
def _log_valid(keys: int) -> list[float]:
    """``ln max(n, 2)`` for ``n`` in ``0..keys``, as numpy's float64 ``log`` gives it (never written to)."""
    logs: list[float] = np.log(np.maximum(np.arange(keys + 1), 2, dtype=np.float64)).tolist()
    return logs


@functools.lru_cache(maxsize=128)
def _distance_lists(rows: int, offset: int, keys: int) -> list[list[float]]:
    """``|i + offset - j|`` ``(L, S)`` as lists (never written to)."""
    return [[float(abs(i + offset - j)) for j in range(keys)] for i in range(rows)]


def probability_diagnostics(probabilities: np.ndarray, axis: int = -1) -> dict[str, Any]:
    """Per-row diagnostics of probabilities for /v1/softmax.

    Rows are all axes but ``axis``, in their original order; each per-row array
    has shape ``probabilities.shape`` without ``axis``. Keys: ``entropy``
    (nats, float64), ``max`` (float64), ``argmax`` (int64, -1 for all-zero
    rows), ``fully_masked_rows``, ``non_finite`` (int), ``row_sum_max_error``
    (float, over rows that are not all zero). Non-finite entries count as 0.
    """
    p = np.asarray(probabilities)
    if p.ndim == 0:
        raise ValueError("probabilities must have at least one axis")
    if not -p.ndim <= axis < p.ndim:
        raise ValueError(f"axis {axis} is out of range for {p.ndim}-D probabilities")
    if not np.issubdtype(p.dtype, np.floating):
        p = p.astype(np.float64)
    moved = np.moveaxis(p, axis, -1)
    row_shape = moved.shape[:-1]
    keys = moved.shape[-1]
    n_rows = math.prod(row_shape)
    st = _row_stats(moved.reshape(1, n_rows, keys), None)
    live = st.live.reshape(row_shape)
    entropy = np.where(live, np.maximum(_finite(st.entropy.reshape(row_shape)), 0.0), 0.0)
    row_err = np.abs(st.row_sum.reshape(row_shape) - 1.0)
    return {
        "entropy": entropy,
        "max": _finite(st.max_weight.reshape(row_shape)),
        "argmax": st.argmax.reshape(row_shape),
        "fully_masked_rows": int(live.size - np.count_nonzero(live)),
        "non_finite": int(st.non_finite),
        "row_sum_max_error": _finite_scalar(float(row_err[live].max())) if live.any() else 0.0,
    }
