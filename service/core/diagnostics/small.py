"""The pure-Python twin of the numpy path, for tiny inputs, where numpy's per-call overhead dominates.

Same results as the numpy path (:func:`service.core.diagnostics.report.attention_diagnostics`) but
for the order of float sums (a few ulps).
"""

from __future__ import annotations

import functools
import itertools
import math
import operator
from typing import Any

import numpy as np

from service.core.diagnostics.rows import BOUND, F32, F64, TINY, count_non_finite, to_finite
from service.core.diagnostics.scores import score_stats
from service.core.diagnostics.thresholds import DiagnosticThresholds

SMALL_DTYPES = (F32, F64)


def small_diagnostics(
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
    if not (-BOUND <= lowest and max(mxs) <= BOUND):
        return None
    # ln as _block_stats takes it: max(A, tiny) in the log dtype when some weight is <= 0, else ln A.
    log_dtype = F32 if w.dtype.itemsize <= 4 else F64
    if bad_rows or not lowest > 0:
        lg = np.log(np.maximum(flat, TINY[log_dtype.itemsize], dtype=log_dtype))
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
            support = to_finite(np.exp(entropy))
    else:
        support = np.exp(entropy)
    support *= floats[4]  # 0 off live rows
    non_finite = sum(bad_rows.values())
    if output is not None:
        non_finite += count_non_finite(np.asarray(output))
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
    """:func:`~.scores.score_stats` of few float32/float64 scores over a list (others go to it).

    The mean and the centred sum of squares are taken as :func:`~.scores.score_stats` takes them
    for one block; only the order of the sums differs.
    """
    if scores.dtype not in SMALL_DTYPES:
        return score_stats(scores)
    values = list(filter(math.isfinite, scores.reshape(-1).tolist()))
    n = len(values)
    if n == 0:
        return None
    block_mean = sum(values) / n
    var = sum([(x - block_mean) * (x - block_mean) for x in values]) / n
    mean = 0.0 + block_mean * n / n  # the block merged into an empty total, as scores.score_stats does
    if not (math.isfinite(mean) and math.isfinite(var)):
        return score_stats(scores)  # beyond ~1e154: the numpy path rescales
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
