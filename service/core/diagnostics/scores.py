"""Score statistics: min, max, mean and population std of the finite scores, merged over blocks."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from service.core.diagnostics import rows
from service.core.diagnostics.rows import to_finite_scalar


def _moments(flat: np.ndarray, scale: float) -> tuple[int, float, float, float, float]:
    """Count, min, max, mean and population variance of the finite entries.

    Blocks are merged with Chan's parallel update; values are multiplied by
    ``scale`` (a power of two, so exactly) before the mean and variance.
    """
    n = 0
    lo, hi = math.inf, -math.inf
    mean = 0.0
    m2 = 0.0
    for i in range(0, flat.size, rows.BLOCK_ELEMENTS):
        x = flat[i : i + rows.BLOCK_ELEMENTS]
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


def score_stats(scores: np.ndarray) -> dict[str, Any] | None:
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
        "min": to_finite_scalar(lo),
        "max": to_finite_scalar(hi),
        "mean": to_finite_scalar(mean),
        "std": to_finite_scalar(std),
        "count": int(n),
    }
