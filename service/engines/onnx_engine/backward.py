"""The backward graph's outputs turned into a :class:`~service.core.backward.BackwardResult`.

The graph gives the gradients of Q, K and V, the weights, the scores and their gradient ``dZ``; the mask,
scale and temperature gradients and the gradient health are derived from those by the formulas of
:func:`service.core.backward.run_backward`, and the contract is checked on the way out (overflow is
invalid input as on numpy, fully masked rows are zero whatever the runtime did).
"""

from __future__ import annotations

import math

import numpy as np

from service.core.attention import Dims, check_live_rows, check_scores_finite, not_finite_error, resolved_scale
from service.core.backward import BackwardResult, BackwardTask, gradient_health, jacobian_norms, sum_to_shape
from service.core.masks import as_4d_mask


def backward_result(
    task: BackwardTask,
    got: dict[str, np.ndarray],
    feeds: dict[str, np.ndarray],
    dims: Dims,
    keep: np.ndarray | None,
    valid_keys: np.ndarray,
) -> BackwardResult:
    """The answer to ``task`` from the backward graph's outputs ``got`` and the ``feeds`` it ran on."""
    fwd = task.task
    dtype = np.dtype(fwd.dtype)
    lead = fwd.inputs.query.shape[:-1]
    mask = fwd.inputs.mask
    want = task.want
    # Overflow is invalid input on both engines alike, never a silent dead row.
    check_scores_finite(got["scores"], keep, dtype)
    check_live_rows(got["weights"].sum(axis=-1) == 0, valid_keys, dtype)
    empty = valid_keys == 0
    if empty.any():  # the contract, whatever the runtime did
        for n in ("output", "weights", "grad_query", "grad_scores"):
            if n in got:
                got[n][empty] = 0
    for n in ("grad_query", "grad_key", "grad_value", "output"):
        if n in got and not np.isfinite(got[n]).all():
            raise not_finite_error(f"{n} is not finite in {dtype.name}", dtype, ": the scores or gradients overflowed")
    params = fwd.params
    T = params.temperature
    result = BackwardResult(valid_keys=valid_keys)
    if "grad_query" in want:
        result.grad_query = got["grad_query"].reshape(fwd.inputs.query.shape)
    if "grad_key" in want:
        result.grad_key = got["grad_key"].reshape(fwd.inputs.key.shape)
    if "grad_value" in want:
        result.grad_value = got["grad_value"].reshape(fwd.inputs.value.shape)
    if "output" in want:
        result.output = got["output"].reshape(lead + (dims.Ev,))
    if "weights" in want:
        result.weights = got["weights"].reshape(lead + (dims.S,))
    if "grad_scale" in want:
        scale = resolved_scale(params, dims.E)
        dq = got["grad_query"].astype(np.float64)
        result.grad_scale = float(np.sum(feeds["query"].astype(np.float64) * dq) / scale)
    if "grad_temperature" in want:
        z, dz = got["scores"], got["grad_scores"]
        result.grad_temperature = -float(np.sum(dz * np.where(np.isneginf(z), 0, z), dtype=np.float64)) / T
    if "grad_mask" in want and mask is not None:
        m4_shape = as_4d_mask(np.asarray(mask), dims.weights_shape).shape
        gm = sum_to_shape(got["grad_scores"].astype(np.float64), m4_shape) / T
        result.grad_mask = gm.astype(dtype).reshape(np.asarray(mask).shape)
    if "gradient_health" in want:
        norms = jacobian_norms(params.normalizer, got["weights"], alpha=params.alpha)
        result.gradient_health = gradient_health(norms, valid_keys, task.vanishing_threshold)
    for n in ("grad_scale", "grad_temperature"):
        value = getattr(result, n)
        if value is not None and not math.isfinite(value):
            raise not_finite_error(f"{n} is not finite", dtype)
    return result
