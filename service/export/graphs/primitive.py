"""The primitive graphs (MatMul, Add, Where, Softmax, TopK, CumSum, ...): one per normalizer and dtype."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

from service.export.builder import GraphBuilder
from service.export.graphs.common import (
    declare_inputs,
    dim_slice,
    row_has_key,
    scaled_query_and_mask_bias,
    zero_empty_rows,
)
from service.export.graphs.normalizers import NORMALIZER_BUILDERS, normalize_entmax_bisect, normalize_relu
from service.export.graphs.spec import OUT_SHAPE, ROW_SHAPE


def build_primitive(g: GraphBuilder, *, normalizer: str) -> None:
    ins = declare_inputs(g, alpha=normalizer == "entmax")
    q, mask_bias = scaled_query_and_mask_bias(g, ins)
    # Grouped-query attention without copying K/V: the G query heads of one kv head are
    # contiguous, so (B, Hq, L, E) reshapes to (B, Hkv, G*L, E) and one MatMul serves them.
    b_hkv = dim_slice(g, ins.key, 0, 2)
    s_dim = dim_slice(g, ins.key, 2, 3)
    b_hq_l = dim_slice(g, ins.query, 0, 3)
    minus1 = g.const([-1], np.int64)
    q_grouped = g.op("Reshape", q, g.op("Concat", b_hkv, minus1, dim_slice(g, ins.query, 3, 4), axis=0))
    k_t = g.op("Transpose", ins.key, perm=[0, 1, 3, 2])
    z_grouped = g.op("MatMul", q_grouped, k_t)
    z_raw = g.op("Reshape", z_grouped, g.op("Concat", b_hq_l, s_dim, axis=0))
    if normalizer == "softmax":
        # Softmax of an all -inf row is NaN in ONNX Runtime, and NaN * 0 stays NaN: rows
        # without a key get bias 0 for the Softmax (their raw scores, finite), are zeroed
        # after it, and get -inf in the scores output (one more pass over (B, Hq, L, S)).
        has_key = row_has_key(g, mask_bias)
        row_bias = g.op("Where", has_key, g.const(0.0), g.const(-np.inf))
        z = g.op("Add", z_raw, g.op("Where", has_key, mask_bias, g.const(0.0)))
        g.op("Add", z, row_bias, out="scores")
        g.op("Softmax", z, axis=-1, out="softmax")
        zero_empty_rows(g, "softmax", has_key, out="weights")
    elif normalizer == "entmax" and g.dtype == "float32":
        g.op("Add", z_raw, mask_bias, out="scores")
        # Near the support boundary p = (x - tau)^(1/(alpha-1)) amplifies float32 rounding of
        # x - tau (for alpha = 3, 3e-8 becomes 2e-4): bisect in float64, as numpy does.
        z64 = g.op("Cast", "scores", to=TensorProto.DOUBLE)
        with g.computing_in("float64"):
            p64 = normalize_entmax_bisect(g, z64)  # alpha is a float64 input
        g.op("Cast", p64, to=TensorProto.FLOAT, out="weights")
    else:
        g.op("Add", z_raw, mask_bias, out="scores")
        p = NORMALIZER_BUILDERS[normalizer](g, "scores")
        g.rename(p, "weights")  # no Identity: ONNX Runtime would copy (B, Hq, L, S)
    p_grouped = g.op("Reshape", "weights", g.op("Concat", b_hkv, minus1, s_dim, axis=0))
    y_grouped = g.op("MatMul", p_grouped, ins.value)
    g.op("Reshape", y_grouped, g.op("Concat", b_hq_l, dim_slice(g, ins.value, 3, 4), axis=0), out="output")
    g.output("output", OUT_SHAPE, "A V, zero for fully masked rows")
    g.output("weights", ROW_SHAPE, f"attention weights ({normalizer}), exactly 0 where masked")
    g.output("scores", ROW_SHAPE, "normalizer input (scale Q K^T + bias) / T, -inf where masked")


def build_relu(g: GraphBuilder) -> None:
    """ReLU attention, its scores and weights formed in float64 (both dtypes), as the numpy engine does.

    ``relu(y / T) / sum relu(y / T)`` with ``y = scale Q K^T + bias`` does not depend on T > 0, so
    the weights are computed from y without the temperature: a temperature of 1e300 (whose scores
    underflow float32) or 1e-40 (whose scores overflow it) cannot turn a row into zeros. scale and
    temperature are float64 inputs for the same reason (a scale of 1e-46 is 0 in float32). The
    scores output is ``y / T`` rounded once to the graph's dtype.
    """
    ins = declare_inputs(g, factors=TensorProto.DOUBLE)
    assert ins.keep is not None and ins.bias is not None
    b_hkv = dim_slice(g, ins.key, 0, 2)
    s_dim = dim_slice(g, ins.key, 2, 3)
    b_hq_l = dim_slice(g, ins.query, 0, 3)
    minus1 = g.const([-1], np.int64)
    wide = g.dtype != "float64"
    q, k, bias = ins.query, ins.key, ins.bias
    if wide:
        q, k, bias = (g.op("Cast", x, to=TensorProto.DOUBLE) for x in (q, k, bias))
    with g.computing_in("float64"):
        q_grouped = g.op("Reshape", q, g.op("Concat", b_hkv, minus1, dim_slice(g, ins.query, 3, 4), axis=0))
        raw = g.op("MatMul", q_grouped, g.op("Transpose", k, perm=[0, 1, 3, 2]))
        raw = g.op("Reshape", raw, g.op("Concat", b_hq_l, s_dim, axis=0))
        y = g.op("Add", g.op("Mul", raw, ins.scale), bias)
        y = g.op("Where", ins.keep, y, g.const(-np.inf))
        scores = g.op("Div", y, ins.temperature, out=None if wide else "scores")
        weights = normalize_relu(g, y)
    if wide:
        g.op("Cast", scores, to=g.onnx_dtype, out="scores")
        g.op("Cast", weights, to=g.onnx_dtype, out="weights")
    else:
        g.rename(weights, "weights")
    p_grouped = g.op("Reshape", "weights", g.op("Concat", b_hkv, minus1, s_dim, axis=0))
    y_grouped = g.op("MatMul", p_grouped, ins.value)
    g.op("Reshape", y_grouped, g.op("Concat", b_hq_l, dim_slice(g, ins.value, 3, 4), axis=0), out="output")
    g.output("output", OUT_SHAPE, "A V, zero for fully masked rows")
    g.output("weights", ROW_SHAPE, "attention weights (relu, computed in float64), exactly 0 where masked")
    g.output("scores", ROW_SHAPE, "normalizer input (scale Q K^T + bias) / T, -inf where masked")
