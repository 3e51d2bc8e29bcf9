"""Pieces every attention graph shares: the inputs, ``Q * scale / T``, the mask bias, rows without a key."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from onnx import TensorProto

from service.export.builder import GraphBuilder
from service.export.graphs.spec import BIAS_SHAPE, K_SHAPE, KEEP_SHAPE, Q_SHAPE, V_SHAPE


@dataclass
class Inputs:
    query: str
    key: str
    value: str
    keep: str | None
    bias: str | None
    scale: str
    temperature: str


def declare_inputs(g: GraphBuilder, *, alpha: bool = False, masked: bool = True, factors: int | None = None) -> Inputs:
    """The graph inputs; ``factors`` is the element type of scale and temperature (the graph's by default)."""
    query = g.input("query", None, Q_SHAPE, "Q (batch, q_heads, q_len, head_dim)")
    key = g.input("key", None, K_SHAPE, "K (batch, kv_heads, kv_len, head_dim); q_heads % kv_heads == 0")
    value = g.input("value", None, V_SHAPE, "V (batch, kv_heads, kv_len, v_head_dim)")
    keep = bias = None
    if masked:
        keep = g.input(
            "keep_mask", TensorProto.BOOL, KEEP_SHAPE, "True = may attend; last two dims exactly (q_len, kv_len)"
        )
        bias = g.input(
            "bias", None, BIAS_SHAPE, "additive float mask, broadcastable to (batch, q_heads, q_len, kv_len)"
        )
    ins = Inputs(
        query=query,
        key=key,
        value=value,
        keep=keep,
        bias=bias,
        scale=g.input("scale", factors, [], "multiplies Q K^T (1/sqrt(head_dim) by convention)"),
        temperature=g.input("temperature", factors, [], "divides the biased scores; > 0"),
    )
    if alpha:
        g.input(
            "alpha",
            TensorProto.DOUBLE,
            [],
            "entmax alpha > 1; float64 in every graph (alpha - 1 may be below float32's resolution)",
        )
    return ins


def scaled_query(g: GraphBuilder, ins: Inputs) -> str:
    """``Q * (scale / T)``: scaling Q (q_len x head_dim) is cheaper than the scores (q_len x kv_len)."""
    factor = g.op("Div", ins.scale, ins.temperature, out="q_factor")
    return g.op("Mul", ins.query, factor, out="query_scaled")


def scaled_query_and_mask_bias(g: GraphBuilder, ins: Inputs) -> tuple[str, str]:
    """``Q * (scale / T)`` and the rank-4 float mask ``Where(keep, bias / T, -inf)``.

    The mask bias has the keep mask's (small) shape and ends in (q_len, kv_len).
    """
    assert ins.keep is not None and ins.bias is not None
    q = scaled_query(g, ins)
    bias_t = g.op("Div", ins.bias, ins.temperature, out="bias_over_t")
    mask_bias = g.op("Where", ins.keep, bias_t, g.const(-np.inf), out="mask_bias")
    return q, mask_bias


def row_has_key(g: GraphBuilder, mask_bias: str) -> str:
    """Bool (mask_batch, mask_heads, q_len, 1): does the row keep at least one key?"""
    row_max = g.op("ReduceMax", mask_bias, g.const([-1], np.int64), keepdims=1, out="mask_row_max")
    return g.op("Greater", row_max, g.const(-np.inf), out="row_has_key")


def zero_empty_rows(g: GraphBuilder, x: str, has_key: str, out: str | None = None) -> str:
    """``x`` with the rows that keep no key set to 0.

    A broadcast Mul by 0/1, which ONNX Runtime runs about four times faster than a
    broadcast Where over (batch, q_heads, q_len, kv_len); NaN rows would stay NaN,
    so the caller keeps NaN out of them.
    """
    row = g.op("Cast", has_key, to=g.onnx_dtype)
    return g.op("Mul", x, row, out=out)


def dim_slice(g: GraphBuilder, x: str, start: int, end: int | None = None) -> str:
    if end is None:
        return g.op("Shape", x, start=start)
    return g.op("Shape", x, start=start, end=end)
