"""The softmax attention graph with its backward pass (docs/concepts/contract.md, "Gradients")."""

from __future__ import annotations

import numpy as np

from service.export.builder import GraphBuilder
from service.export.graphs.common import (
    declare_inputs,
    dim_slice,
    row_has_key,
    scaled_query_and_mask_bias,
    zero_empty_rows,
)
from service.export.graphs.spec import K_SHAPE, OUT_SHAPE, Q_SHAPE, ROW_SHAPE, V_SHAPE

GRAD_WEIGHTS_SHAPE = ["gw_batch", "gw_heads", "gw_q_len", "gw_kv_len"]
BACKWARD_OUTPUTS = ("grad_query", "grad_key", "grad_value", "output", "weights", "scores", "grad_scores")


def build_softmax_backward(g: GraphBuilder) -> None:
    """Softmax attention and its backward (the contract's "Gradients") in one graph.

    The forward part is the primitive softmax graph's (grouped-query MatMuls, rows
    without a key zeroed); then, with ``G = (B, Hkv, group * L, .)`` views:
    ``dV = A^T dO``, ``dA = dO V^T + grad_weights``, ``dZ = A (dA - sum(A dA))``
    (softmax's VJP; 0 where masked since A is), ``dQ = (scale/T) dZ K``,
    ``dK = (scale/T) dZ^T Q``. ``grad_scores`` is ``dZ``, from which the engine
    derives the mask, scale and temperature gradients.
    """
    ins = declare_inputs(g)
    grad_output = g.input("grad_output", None, OUT_SHAPE, "dL/d output, the output's shape")
    grad_weights = g.input(
        "grad_weights",
        None,
        GRAD_WEIGHTS_SHAPE,
        "dL/d weights, broadcastable to (batch, q_heads, q_len, kv_len); (1, 1, 1, 1) zeros if none",
    )
    q, mask_bias = scaled_query_and_mask_bias(g, ins)
    b_hkv = dim_slice(g, ins.key, 0, 2)
    s_dim = dim_slice(g, ins.key, 2, 3)
    e_dim = dim_slice(g, ins.query, 3, 4)
    ev_dim = dim_slice(g, ins.value, 3, 4)
    b_hq_l = dim_slice(g, ins.query, 0, 3)
    minus1 = g.const([-1], np.int64)
    grouped_e = g.op("Concat", b_hkv, minus1, e_dim, axis=0)
    grouped_s = g.op("Concat", b_hkv, minus1, s_dim, axis=0)
    grouped_ev = g.op("Concat", b_hkv, minus1, ev_dim, axis=0)
    rows_s = g.op("Concat", b_hq_l, s_dim, axis=0)
    k_t = g.op("Transpose", ins.key, perm=[0, 1, 3, 2])
    z_raw = g.op("Reshape", g.op("MatMul", g.op("Reshape", q, grouped_e), k_t), rows_s)
    # as the forward softmax graph: rows without a key get bias 0 for the Softmax, then are zeroed
    has_key = row_has_key(g, mask_bias)
    row_bias = g.op("Where", has_key, g.const(0.0), g.const(-np.inf))
    z = g.op("Add", z_raw, g.op("Where", has_key, mask_bias, g.const(0.0)))
    g.op("Add", z, row_bias, out="scores")
    g.op("Softmax", z, axis=-1, out="softmax")
    weights = zero_empty_rows(g, "softmax", has_key, out="weights")
    p_grouped = g.op("Reshape", weights, grouped_s)
    g.op("Reshape", g.op("MatMul", p_grouped, ins.value), g.op("Concat", b_hq_l, ev_dim, axis=0), out="output")
    do_grouped = g.op("Reshape", grad_output, grouped_ev)
    g.op("MatMul", g.op("Transpose", p_grouped, perm=[0, 1, 3, 2]), do_grouped, out="grad_value")
    v_t = g.op("Transpose", ins.value, perm=[0, 1, 3, 2])
    da = g.op("Add", g.op("Reshape", g.op("MatMul", do_grouped, v_t), rows_s), grad_weights)
    pda = g.op("Mul", weights, da)
    row_dot = g.op("ReduceSum", pda, minus1, keepdims=1)
    dz = g.op("Sub", pda, g.op("Mul", weights, row_dot), out="grad_scores")
    ds_grouped = g.op("Reshape", g.op("Mul", dz, "q_factor"), grouped_s)
    g.op("Reshape", g.op("MatMul", ds_grouped, ins.key), g.op("Concat", b_hq_l, e_dim, axis=0), out="grad_query")
    q_grouped_raw = g.op("Reshape", ins.query, grouped_e)
    g.op("MatMul", g.op("Transpose", ds_grouped, perm=[0, 1, 3, 2]), q_grouped_raw, out="grad_key")
    g.output("grad_query", Q_SHAPE, "dL/d query")
    g.output("grad_key", K_SHAPE, "dL/d key, summed over the query heads that share each kv head")
    g.output("grad_value", V_SHAPE, "dL/d value, summed over the query heads that share each kv head")
    g.output("output", OUT_SHAPE, "A V, zero for fully masked rows")
    g.output("weights", ROW_SHAPE, "attention weights (softmax), exactly 0 where masked")
    g.output("scores", ROW_SHAPE, "normalizer input (scale Q K^T + bias) / T, -inf where masked")
    g.output("grad_scores", ROW_SHAPE, "dL/d scores (the normalizer input), exactly 0 where masked")
