"""The attention diagnostics of a request: the per-row arrays, the per-head summaries and the numerical health.

Small inputs (``B * Hq * L * S + 16 * B * Hq * L <= 384``) take the list path
(:func:`~service.core.diagnostics.small.small_diagnostics`) instead of the numpy one.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from service.core.diagnostics.rows import count_non_finite, row_stats, to_finite, to_finite_scalar
from service.core.diagnostics.scores import score_stats
from service.core.diagnostics.small import SMALL_DTYPES, small_diagnostics
from service.core.diagnostics.thresholds import DiagnosticThresholds

_CAUSAL = (None, "top_left", "bottom_right")
_DEFAULT_THRESHOLDS = DiagnosticThresholds()

_SMALL_WORK = 384
"""Inputs with ``weights + 16 * rows <= 384`` (``B * Hq * L * S`` weights, ``B * Hq * L`` rows) take the list path.

The numpy path costs ~80 us whatever the size (about 60 numpy calls at ~1 us each
on tiny arrays); the list path ~20 us plus ~2 us per row and ~0.15 us per weight
(scores included). ``bench/bench_diagnostics.py`` measured the list path faster
(1.1-3x) at every shape under this line, e.g. (1, 1, 4, 4), (1, 2, 8, 8),
(1, 1, 4, 64), and slower (0.9x or less) above it, e.g. (1, 1, 16, 16), (1, 1, 32, 4).
"""
_ROW_WORK = 16


def attention_diagnostics(
    weights: np.ndarray,
    valid_keys: np.ndarray,
    *,
    scores: np.ndarray | None = None,
    output: np.ndarray | None = None,
    causal: str | None = None,
    thresholds: DiagnosticThresholds = _DEFAULT_THRESHOLDS,
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
    if w.dtype in SMALL_DTYPES and 0 < w.size and w.size + _ROW_WORK * (w.size // keys) <= _SMALL_WORK:
        small = small_diagnostics(w, nv, scores, output, offset, thresholds)
        if small is not None:
            return small
    st = row_stats(w.reshape(batch * heads, rows, keys), query_positions(rows, offset))
    live = st.live.reshape(shape)
    finite = (lambda x: x) if st.bounded else to_finite  # bounded weights give finite sums: nothing to clamp
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
            support = np.where(live, to_finite(np.exp(entropy)), 0.0)
    else:
        support = np.where(live, np.exp(entropy), 0.0)
    if st.any_zeros:
        zeros = np.minimum(np.maximum(st.zero_count.reshape(shape) - (keys - nv), 0), nv)
    else:  # no zero weight: 0 - (keys - nv) <= 0 clips to 0 everywhere
        zeros = np.zeros(shape, np.int64)

    row_err = np.abs(st.row_sum.reshape(shape) - 1.0)
    n_live = int(np.count_nonzero(live))
    if n_live == live.size:
        row_sum_max_error = to_finite_scalar(float(np.maximum.reduce(row_err, axis=None)))
    else:
        row_sum_max_error = to_finite_scalar(float(row_err[live].max())) if n_live else 0.0
    saturated = informative & (max_weight > 1.0 - thresholds.saturation_margin)
    non_finite = st.non_finite
    if output is not None:
        non_finite += count_non_finite(np.asarray(output))

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
        "score_stats": score_stats(np.asarray(scores)) if scores is not None else None,
    }


@functools.lru_cache(maxsize=256)
def query_positions(rows: int, offset: int) -> np.ndarray:
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
    means = to_finite(
        sums[:3] / divisors[[0, 0, 1]]
    )  # entropy and distance over live rows, normalized over informative
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
