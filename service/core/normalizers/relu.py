"""The ReLU normalizer ``relu(z) / sum(relu(z))`` and its row sums, computed without overflow."""

from __future__ import annotations

import numpy as np

from service.core.normalizers.rows import as_float, safe_denominator


def relu_normalize(z: np.ndarray, axis: int = -1) -> np.ndarray:
    """ReLU normalizer: ``relu(z) / sum(relu(z))``; rows with relu sum 0 give zeros.

    Not a regularised argmax and not shift invariant, so the row max is not
    subtracted; rows are scaled by their largest relu value before summing so
    huge scores cannot overflow the sum. It is invariant to a positive factor
    (``relu(c z) = c relu(z)``), so callers may leave out the temperature (and,
    without a bias, the scale) rather than let them underflow or overflow.
    """
    z = as_float(z)
    if z.size == 0:
        return np.zeros_like(z)
    r: np.ndarray = np.maximum(z, 0)
    with np.errstate(under="ignore"):
        r /= safe_denominator(np.max(r, axis=axis, keepdims=True))
        r /= safe_denominator(np.sum(r, axis=axis, keepdims=True))
    return r


def relu_row_sums(z: np.ndarray, p: np.ndarray, axis: int = -1) -> np.ndarray:
    """``sum(relu(z))`` per row (keepdims) from the scores and their relu weights ``p``, as ``max(z) / max(p)``.

    ``max(p) = max(z) / s`` on a row with a positive score, so the quotient gives ``s`` to a few ulps
    without summing (a sum of scores near 1e308 overflows; ``max(z)`` and ``max(p) >= 1 / n`` do not).
    Rows without a positive score give 1 (their gradients are 0 anyway).
    """
    p_max = np.max(p, axis=axis, keepdims=True)
    z_max = np.max(z, axis=axis, keepdims=True)
    live = (p_max > 0) & (z_max > 0)
    with np.errstate(under="ignore", over="ignore"):
        sums: np.ndarray = np.where(live, z_max / np.where(live, p_max, 1), 1)
    return sums
