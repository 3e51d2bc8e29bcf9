"""Softmax and log-softmax (docs/concepts/normalizers.md, "softmax")."""

from __future__ import annotations

import numpy as np

from service.core.normalizers.rows import as_float, row_max, safe_denominator


def softmax(z: np.ndarray, axis: int = -1, *, out: np.ndarray | None = None) -> np.ndarray:
    """Softmax: ``exp(z - max) / sum(exp(z - max))``.

    Solves ``argmax_{p in Delta} <p, z> + H(p)`` with Shannon entropy
    ``H(p) = -sum_j p_j log p_j`` (the alpha -> 1 limit of entmax; Blondel et
    al. 2020). ``out`` may be ``z`` itself: the max is subtracted, exponentiated
    and divided in place, and only per-row temporaries are allocated.
    """
    z = as_float(z)
    if out is None:
        if z.size == 0:
            return np.zeros_like(z)
        m = row_max(z, axis)
        with np.errstate(over="ignore"):  # z - max overflowing to -inf has weight exp(-inf) = 0: right
            res: np.ndarray = np.subtract(z, m)
    else:
        if out.shape != z.shape:
            raise ValueError(f"out has shape {out.shape}, expected {z.shape}")
        if not np.issubdtype(out.dtype, np.floating):
            raise TypeError(f"out must have a floating dtype, got {out.dtype}")
        if z.size == 0:
            return out
        m = row_max(z, axis)
        with np.errstate(over="ignore"):  # z - max overflowing to -inf has weight exp(-inf) = 0: right
            res = np.subtract(z, m, out=out)
    with np.errstate(under="ignore"):
        np.exp(res, out=res)
        s = safe_denominator(np.sum(res, axis=axis, keepdims=True))
        np.divide(res, s, out=res)
    return res


def log_softmax(z: np.ndarray, axis: int = -1) -> np.ndarray:
    """Log of softmax: ``z - max - log(sum(exp(z - max)))``.

    Masked positions give ``-inf``; a fully masked row gives all ``-inf``. A log-probability below the
    dtype's range comes out ``-inf`` too: callers that must tell it from a masked position compute in a
    wider dtype (as :func:`service.core.probabilities.normalize_logits` does).
    """
    z = as_float(z)
    if z.size == 0:
        return np.zeros_like(z)
    with np.errstate(over="ignore"):
        shifted: np.ndarray = z - row_max(z, axis)
    with np.errstate(under="ignore"):
        s = safe_denominator(np.sum(np.exp(shifted), axis=axis, keepdims=True))
    shifted -= np.log(s)
    return shifted
