"""The inputs of a graph for a request, validated and masked exactly as the numpy reference does."""

from __future__ import annotations

import numpy as np

from service.core.attention import (
    Dims,
    check_dims,
    check_params,
    promote_to_4d,
    resolved_scale,
    scaled_bias,
    score_factor,
    widened_factor,
)
from service.core.masks import as_4d_mask, keep_mask, valid_key_counts
from service.core.types import AttentionTask


def graph_feeds(
    task: AttentionTask, input_names: frozenset[str], input_dtypes: dict[str, np.dtype]
) -> tuple[dict[str, np.ndarray], Dims, np.ndarray | None, np.ndarray]:
    """The inputs of a graph with inputs ``input_names`` (of ``input_dtypes`` where not the task's) for ``task``.

    Also the sizes, the combined keep mask (None when nothing masks) and ``valid_keys`` (B, Hq, L). The same
    validation, keep mask (:func:`service.core.masks.keep_mask`) and rounding of ``scale / T`` and
    ``bias / T`` as the numpy engine.
    """
    params = task.params
    check_params(params)
    inputs = task.inputs
    dims = check_dims(inputs.query.shape, inputs.key.shape, inputs.value.shape)
    dtype = np.dtype(task.dtype)
    B, Hq, L, S = dims.weights_shape
    target = (B, Hq, L, S)

    keep = keep_mask(B, Hq, L, S, mask=inputs.mask, causal=params.causal, key_lengths=inputs.key_lengths)
    valid_keys = valid_key_counts(keep, target)
    scale = resolved_scale(params, dims.E)
    relu = params.normalizer == "relu"
    mask = inputs.mask
    float_mask = None if mask is None or np.asarray(mask).dtype == bool else as_4d_mask(np.asarray(mask), target)
    types = input_dtypes
    factor: float | np.floating
    if relu:
        # The relu graphs take scale and temperature in float64 and leave the temperature out of the
        # weights (relu is invariant to it), as the numpy engine does.
        factor, temperature, bias = scale, params.temperature, float_mask
    else:
        # scale / T and bias / T divided in float64 and rounded once, exactly as the numpy engine
        # does (a temperature beyond float32's range must not reach the graph as inf).
        factor, temperature = score_factor(scale, params.temperature, dtype), 1.0
        bias = None if float_mask is None else scaled_bias(float_mask, params.temperature, dtype)
    query = promote_to_4d(inputs.query)
    if not relu and widened_factor(factor, dtype):
        # scale / T underflows the graph's float32 scale: the query is scaled in float64 and rounded
        # once instead, as the numpy engine forms Q * factor
        query, factor = np.asarray(query, dtype=np.float64) * factor, 1.0
    feeds = {
        "query": np.ascontiguousarray(query, dtype=dtype),
        "key": np.ascontiguousarray(promote_to_4d(inputs.key), dtype=dtype),
        "value": np.ascontiguousarray(promote_to_4d(inputs.value), dtype=dtype),
        "scale": np.array(factor, dtype=types.get("scale", dtype)),
        "temperature": np.array(temperature, dtype=types.get("temperature", dtype)),
    }
    graph_inputs = input_names
    if "keep_mask" in graph_inputs:
        # the Attention operator needs the mask's last two dims to be exactly (L, S)
        keep4 = np.ones((1, 1, 1, 1), dtype=bool) if keep is None else keep
        feeds["keep_mask"] = np.ascontiguousarray(np.broadcast_to(keep4, keep4.shape[:2] + (L, S)))
        if bias is not None:
            feeds["bias"] = np.ascontiguousarray(bias, dtype=dtype)
        else:
            feeds["bias"] = np.zeros((1, 1, 1, 1), dtype=dtype)
    if "alpha" in graph_inputs:
        feeds["alpha"] = np.array(params.alpha, dtype=types.get("alpha", dtype))  # float64: alpha - 1 may be tiny
    return feeds, dims, keep, valid_keys
