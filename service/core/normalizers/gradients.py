"""The normalizers' vector-Jacobian products (docs/concepts/normalizers.md, "Gradients")."""

from __future__ import annotations

import numpy as np

from service.core.normalizers.relu import relu_normalize, relu_row_sums
from service.core.normalizers.rows import as_float, safe_denominator


def _float_pair(p: np.ndarray, g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    p = as_float(p)
    g = np.asarray(g)
    dtype = np.result_type(p.dtype, g.dtype)
    if not np.issubdtype(dtype, np.floating):
        dtype = np.dtype(np.float64)
    return p.astype(dtype, copy=False), g.astype(dtype, copy=False)


def softmax_backward(p: np.ndarray, g: np.ndarray, axis: int = -1) -> np.ndarray:
    """Softmax VJP: ``dz = p * (g - sum(p * g))``, with p the softmax output."""
    p, g = _float_pair(p, g)
    pg = p * np.where(p > 0, g, 0)
    grad: np.ndarray = pg - p * np.sum(pg, axis=axis, keepdims=True)
    return grad


def sparsemax_backward(p: np.ndarray, g: np.ndarray, axis: int = -1) -> np.ndarray:
    """Sparsemax VJP: on the support ``S = {p > 0}``, ``dz_i = g_i - mean_S g``; 0 elsewhere."""
    p, g = _float_pair(p, g)
    support = p > 0
    gs = np.where(support, g, 0)
    n = np.count_nonzero(support, axis=axis, keepdims=True)
    mean = np.sum(gs, axis=axis, keepdims=True) / np.maximum(n, 1).astype(gs.dtype)
    return np.where(support, gs - mean, 0).astype(gs.dtype, copy=False)


def entmax_backward(p: np.ndarray, g: np.ndarray, alpha: float, axis: int = -1) -> np.ndarray:
    """alpha-entmax VJP: ``w = p^(2-alpha)`` on the support, ``dz = w g - (sum(w g)/sum(w)) w``.

    ``alpha = 1.5`` is entmax15's and ``alpha = 2`` sparsemax's backward.
    """
    alpha = float(alpha)
    if not (np.isfinite(alpha) and alpha > 1.0):
        raise ValueError(f"entmax needs alpha > 1, got {alpha}")
    p, g = _float_pair(p, g)
    support = p > 0
    w = np.zeros_like(p)
    np.power(p, 2.0 - alpha, out=w, where=support)
    wg = w * np.where(support, g, 0)
    sw = safe_denominator(np.sum(w, axis=axis, keepdims=True))
    grad: np.ndarray = wg - (np.sum(wg, axis=axis, keepdims=True) / sw) * w
    return grad


def relu_backward(z: np.ndarray, g: np.ndarray, axis: int = -1, *, p: np.ndarray | None = None) -> np.ndarray:
    """VJP of ``p = relu(z) / s``, ``s = sum(relu(z))``: ``dz_j = [z_j > 0] (g_j - sum(g p)) / s``.

    Rows with ``s = 0`` get a zero gradient (as do positions with ``z_j <= 0``). ``p`` defaults to
    :func:`relu_normalize` of ``z``; a caller that has the weights passes them. ``s`` is never summed:
    it is :func:`relu_row_sums`, so scores near the dtype's limits neither overflow it nor lose it.
    """
    z, g = _float_pair(z, g)
    if p is None:
        p = relu_normalize(z, axis)
    active = z > 0
    grad: np.ndarray = np.where(active, g, 0)  # g may hold anything off the support (masked positions)
    with np.errstate(under="ignore", over="ignore"):
        grad -= np.sum(grad * p, axis=axis, keepdims=True)
        grad /= relu_row_sums(z, p, axis)
    grad *= active
    return grad.astype(z.dtype, copy=False)
