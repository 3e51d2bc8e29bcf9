"""Per-row diagnostics of probabilities along one axis (/v1/softmax)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from service.core.diagnostics.rows import row_stats, to_finite, to_finite_scalar


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
    st = row_stats(moved.reshape(1, n_rows, keys), None)
    live = st.live.reshape(row_shape)
    entropy = np.where(live, np.maximum(to_finite(st.entropy.reshape(row_shape)), 0.0), 0.0)
    row_err = np.abs(st.row_sum.reshape(row_shape) - 1.0)
    return {
        "entropy": entropy,
        "max": to_finite(st.max_weight.reshape(row_shape)),
        "argmax": st.argmax.reshape(row_shape),
        "fully_masked_rows": int(live.size - np.count_nonzero(live)),
        "non_finite": int(st.non_finite),
        "row_sum_max_error": to_finite_scalar(float(row_err[live].max())) if live.any() else 0.0,
    }
