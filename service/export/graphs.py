"""The attention graphs written to models/, built with ``onnx.helper``.

Every graph has these inputs (``softmax_fused_nomask_*`` lacks keep_mask and
bias), so that one session serves every value of the masks, key lengths, scale
and temperature:

============  =====================================  ==========================================
input         shape                                  meaning
============  =====================================  ==========================================
query         (batch, q_heads, q_len, head_dim)      Q, rank 4 (the engine promotes ranks 2, 3)
key           (batch, kv_heads, kv_len, head_dim)    K; q_heads % kv_heads == 0 (GQA, h -> h // G)
value         (batch, kv_heads, kv_len, v_head_dim)  V
keep_mask     (mask_batch, mask_heads, q_len, kv_len) bool, True = may attend; mask_batch in {1, batch},
                                                      mask_heads in {1, q_heads}. The engine builds it
                                                      from the boolean mask, causal (either alignment),
                                                      key_lengths and the -inf entries of a float mask.
bias          (bias_batch, bias_heads, bias_q_len,   additive float mask, broadcastable to
               bias_kv_len)                           (batch, q_heads, q_len, kv_len); (1,1,1,1) zeros if none
scale         ()                                     multiplies Q K^T (float64 in the relu graphs)
temperature   ()                                     divides the biased scores (float64 in the relu graphs;
                                                      the engine feeds the others scale/T and 1)
alpha         ()                                     entmax graphs only: alpha > 1
============  =====================================  ==========================================

and computes semantics.md's pipeline: ``z = (scale Q K^T + bias) / T`` with
``-inf`` where ``keep_mask`` is False (by ``Where``: selection, never a
finite sentinel), a normalizer over the key axis, ``output = A V``. A fully
masked row gives zero weights and a zero output (inside the primitive graphs;
by the Attention operator's own spec in the fused ones, and the engine checks).

Two families:

- ``softmax_fused_*``: the ONNX ``Attention`` operator (opset 23), which ONNX
  Runtime runs as one kernel. Q is pre-multiplied by ``scale / T`` and the
  operator's own ``scale`` is 1; the mask is passed as a float bias holding
  ``-inf`` (never the boolean form, which some runtimes turn into -10000).
  ``softmax_fused_{dtype}`` returns only the output (the weights are never
  materialised as a graph output); ``softmax_fused_weights_{dtype}`` adds the
  weights (``qk_matmul_output_mode = 3``); ``softmax_fused_nomask_{dtype}``
  serves unmasked requests without the mask inputs. ONNX Runtime's CPU provider has
  Attention kernels for float32 and float16 only: for float64 it expands the
  operator's function body into primitive operators, with the same results.
- primitive graphs (MatMul, Add, Where, Softmax, TopK, CumSum, ...), one per
  normalizer and dtype, returning output, weights and the scores (the
  normalizer's input, ``-inf`` where masked). ONNX Runtime runs every node
  whichever outputs are fetched, and these normalizers materialise the weights
  anyway, so one variant serves all requests; the scores cost one extra pass
  only in the softmax graph, which the engine uses only when scores are asked for.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto

from service.export.builder import IR_VERSION, OPSET, GraphBuilder

DTYPES = ("float32", "float64")
CAUSAL_ALIGNMENTS = ["top_left", "bottom_right"]
# Bisection steps of the general entmax graph, which computes in float64 for both dtypes
# (as the numpy reference does): a bracket of width <= 1 shrinks to 2^-64 ~ 5.4e-20.
BISECT_ITERATIONS = 64

Q_SHAPE = ["batch", "q_heads", "q_len", "head_dim"]
K_SHAPE = ["batch", "kv_heads", "kv_len", "head_dim"]
V_SHAPE = ["batch", "kv_heads", "kv_len", "v_head_dim"]
KEEP_SHAPE = ["mask_batch", "mask_heads", "q_len", "kv_len"]
BIAS_SHAPE = ["bias_batch", "bias_heads", "bias_q_len", "bias_kv_len"]
OUT_SHAPE = ["batch", "q_heads", "q_len", "v_head_dim"]
ROW_SHAPE = ["batch", "q_heads", "q_len", "kv_len"]
ROW_STAT_SHAPE: list[str | int] = ["batch", "q_heads", "q_len", 1]


@dataclass(frozen=True)
class GraphSpec:
    """One exported graph: its file stem, how to build it and what it supports."""

    name: str
    dtype: str
    normalizer: str  # softmax | sparsemax | entmax15 | entmax | relu
    fused: bool
    outputs: tuple[str, ...]
    build: Callable[[GraphBuilder], None] = field(repr=False, compare=False)
    description: str = ""
    masked: bool = True  # False: no keep_mask/bias inputs (the Attention kernel then skips the mask)
    backward: bool = False  # True: the backward pass (inputs grad_output, grad_weights; outputs the gradients)

    @property
    def file(self) -> str:
        return f"{self.name}.onnx"

    def supports(self) -> dict[str, Any]:
        """What the manifest says this graph serves (read by the engine to pick a graph)."""
        if self.normalizer == "entmax":
            alpha: Any = "any alpha > 1 (input 'alpha')"
        elif self.normalizer == "sparsemax":
            alpha = 2.0
        elif self.normalizer == "entmax15":
            alpha = 1.5
        else:
            alpha = None
        return {
            "pass": "backward" if self.backward else "forward",
            "normalizer": self.normalizer,
            "entmax_alpha": alpha,
            "dtype": self.dtype,
            "outputs": list(self.outputs),
            "weights": "weights" in self.outputs,
            "scores": "scores" in self.outputs,
            "fused_attention_op": self.fused,
            "masking": self.masked,
            "causal": list(CAUSAL_ALIGNMENTS) if self.masked else [],
            "masks": ["bool", "float", "none"] if self.masked else ["none"],
            "key_lengths": self.masked,
            "gqa": True,
            "scale_input": True,
            "temperature_input": True,
            "fully_masked_rows": (
                "zero by the Attention operator's spec; the engine zeroes them whatever the runtime did"
                if self.fused
                else "zero output and weights, in the graph"
            ),
        }

    def model(self) -> onnx.ModelProto:
        g = GraphBuilder(self.name, self.dtype)
        self.build(g)
        return g.model(self.description)


# ---------------------------------------------------------------------- common pieces


@dataclass
class _Inputs:
    query: str
    key: str
    value: str
    keep: str | None
    bias: str | None
    scale: str
    temperature: str


def _declare_inputs(
    g: GraphBuilder, *, alpha: bool = False, masked: bool = True, factors: int | None = None
) -> _Inputs:
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
    ins = _Inputs(
        query=query,
        key=key,
        value=value,
        keep=keep,
        bias=bias,
        scale=g.input("scale", factors, [], "multiplies Q K^T (1/sqrt(head_dim) by convention)"),
        temperature=g.input("temperature", factors, [], "divides the biased scores; > 0"),
    )
    if alpha:
        g.input("alpha", None, [], "entmax alpha > 1")
    return ins


def _scaled_query(g: GraphBuilder, ins: _Inputs) -> str:
    """``Q * (scale / T)``: scaling Q (q_len x head_dim) is cheaper than the scores (q_len x kv_len)."""
    factor = g.op("Div", ins.scale, ins.temperature, out="q_factor")
    return g.op("Mul", ins.query, factor, out="query_scaled")


def _scaled_query_and_mask_bias(g: GraphBuilder, ins: _Inputs) -> tuple[str, str]:
    """``Q * (scale / T)`` and the rank-4 float mask ``Where(keep, bias / T, -inf)``.

    The mask bias has the keep mask's (small) shape and ends in (q_len, kv_len).
    """
    assert ins.keep is not None and ins.bias is not None
    q = _scaled_query(g, ins)
    bias_t = g.op("Div", ins.bias, ins.temperature, out="bias_over_t")
    mask_bias = g.op("Where", ins.keep, bias_t, g.const(-np.inf), out="mask_bias")
    return q, mask_bias


def _row_has_key(g: GraphBuilder, mask_bias: str) -> str:
    """Bool (mask_batch, mask_heads, q_len, 1): does the row keep at least one key?"""
    row_max = g.op("ReduceMax", mask_bias, g.const([-1], np.int64), keepdims=1, out="mask_row_max")
    return g.op("Greater", row_max, g.const(-np.inf), out="row_has_key")


def _zero_empty_rows(g: GraphBuilder, x: str, has_key: str, out: str | None = None) -> str:
    """``x`` with the rows that keep no key set to 0.

    A broadcast Mul by 0/1, which ONNX Runtime runs about four times faster than a
    broadcast Where over (batch, q_heads, q_len, kv_len); NaN rows would stay NaN,
    so the caller keeps NaN out of them.
    """
    row = g.op("Cast", has_key, to=g.onnx_dtype)
    return g.op("Mul", x, row, out=out)


def _shape(g: GraphBuilder, x: str, start: int, end: int | None = None) -> str:
    if end is None:
        return g.op("Shape", x, start=start)
    return g.op("Shape", x, start=start, end=end)


# ---------------------------------------------------------------------- fused softmax


def _build_fused(g: GraphBuilder, *, weights: bool, masked: bool = True) -> None:
    """One Attention node and nothing over (B, Hq, L, *) around it.

    Fully masked rows are left to the operator, whose spec (opset 23 with its
    errata) makes them zero; runtimes that use a finite sentinel instead return
    the mean of V there, which the engine zeroes (it knows the rows from the keep
    mask). A guard in the graph would cost a pass over the weights.

    ``masked=False`` drops the mask inputs: ONNX Runtime's kernel then skips
    copying the (q_len, kv_len) mask into every head's scores (about 10% of the
    time on (4, 12, 512, 64)), which is what unmasked requests get.

    onnx's shape inference gives ``qk_matmul_output`` a last dim of 0 when kv_len
    is symbolic, so ONNX Runtime logs a shape warning on every run of the weights
    variant; the engine runs that session at log level error. Reshaping to the
    runtime shape would silence it at the price of copying the weights.
    """
    ins = _declare_inputs(g, masked=masked)
    if masked:
        q, mask_bias = _scaled_query_and_mask_bias(g, ins)
        operands = [q, ins.key, ins.value, mask_bias]
    else:
        operands = [_scaled_query(g, ins), ins.key, ins.value]
    outs = ["output", "", "", "weights"] if weights else "output"
    extra: dict[str, Any] = {"qk_matmul_output_mode": 3} if weights else {}
    g.op("Attention", *operands, out=outs, scale=1.0, **extra)
    g.output("output", OUT_SHAPE, "A V; fully masked rows zero per the operator's spec")
    if weights:
        g.output("weights", ROW_SHAPE, "attention weights (softmax), 0 where masked")


# ---------------------------------------------------------------------- primitive graphs


def _shifted(g: GraphBuilder, z: str) -> str:
    """``z - rowmax`` over the finite entries; a fully masked row stays all -inf (never NaN)."""
    m = g.op("ReduceMax", z, g.const([-1], np.int64), keepdims=1)
    m_safe = g.op("Max", m, g.const(np.finfo(g.np_dtype).min))
    return g.op("Sub", z, m_safe)


def _sorted_candidates(g: GraphBuilder, x: str) -> tuple[str, str, str]:
    """``x`` (row max 0) sorted descending; entries <= -1 can never be in the support
    (tau >= -1 for sparsemax, entmax15 and alpha-entmax) and are replaced by 0 and flagged.

    Returns (sorted values with non-candidates 0, candidate flags, k = 1..n as dtype).
    """
    n = _shape(g, x, 3, 4)
    srt = g.op("TopK", x, n, axis=-1, largest=1, sorted=1, n_out=2)[0]
    cand = g.op("Greater", srt, g.const(-1.0))
    srt0 = g.op("Where", cand, srt, g.const(0.0))
    n_scalar = g.op("Squeeze", n, g.const([0], np.int64))
    k_int = g.op("Range", g.const(1, np.int64), g.op("Add", n_scalar, g.const(1, np.int64)), g.const(1, np.int64))
    k = g.op("Cast", k_int, to=g.onnx_dtype)
    return srt0, cand, k


def _gather_at_support(g: GraphBuilder, values: str, support: str) -> tuple[str, str]:
    """(values at index K-1, max(K, 1)) with K the support size of each row."""
    size = g.op("ReduceSum", g.op("Cast", support, to=g.onnx_dtype), g.const([-1], np.int64), keepdims=1)
    size1 = g.op("Max", size, g.const(1.0))
    idx = g.op("Cast", g.op("Sub", size1, g.const(1.0)), to=TensorProto.INT64)
    return g.op("GatherElements", values, idx, axis=-1), size1


def _normalize_sparsemax(g: GraphBuilder, z: str) -> str:
    x = _shifted(g, z)
    srt0, cand, k = _sorted_candidates(g, x)
    c = g.op("Sub", g.op("CumSum", srt0, g.const(-1, np.int64)), g.const(1.0))
    support = g.op("And", g.op("Greater", g.op("Mul", k, srt0), c), cand)
    c_k, size1 = _gather_at_support(g, c, support)
    tau = g.op("Div", c_k, size1)
    return g.op("Relu", g.op("Sub", x, tau))


def _normalize_entmax15(g: GraphBuilder, z: str) -> str:
    x = g.op("Mul", _shifted(g, z), g.const(0.5))
    srt0, cand, k = _sorted_candidates(g, x)
    axis = g.const(-1, np.int64)
    mean = g.op("Div", g.op("CumSum", srt0, axis), k)
    meansq = g.op("Div", g.op("CumSum", g.op("Mul", srt0, srt0), axis), k)
    # delta_k = (1 - ss_k) / k = 1/k - (meansq_k - mean_k^2)
    delta = g.op("Sub", g.op("Reciprocal", k), g.op("Sub", meansq, g.op("Mul", mean, mean)))
    tau = g.op("Sub", mean, g.op("Sqrt", g.op("Relu", delta)))
    support = g.op("And", g.op("LessOrEqual", tau, srt0), cand)
    tau_star, _ = _gather_at_support(g, tau, support)
    r = g.op("Relu", g.op("Sub", x, tau_star))
    return g.op("Mul", r, r)


def _safe_normalize(g: GraphBuilder, p: str) -> str:
    """``p / sum(p)`` over the keys; rows summing to 0 stay 0 (0/1, not 0/0)."""
    s = g.op("ReduceSum", p, g.const([-1], np.int64), keepdims=1)
    s_safe = g.op("Where", g.op("Greater", s, g.const(0.0)), s, g.const(1.0))
    return g.op("Div", p, s_safe)


def _normalize_relu(g: GraphBuilder, z: str) -> str:
    """``relu(z) / sum relu(z)``, each row first scaled by its largest relu value, as the numpy
    reference does: the sum of three scores of 3e38 overflows float32, the scaled sum (3) does not.
    Not shift invariant, so no max subtraction; masked entries are -inf -> relu 0.
    """
    r = g.op("Relu", z)
    m = g.op("ReduceMax", r, g.const([-1], np.int64), keepdims=1)
    m_safe = g.op("Where", g.op("Greater", m, g.const(0.0)), m, g.const(1.0))
    return _safe_normalize(g, g.op("Div", r, m_safe))


def _normalize_entmax_bisect(g: GraphBuilder, z: str, alpha: str = "alpha") -> str:
    """alpha-entmax by bisection on tau, as the entmax package's ``entmax_bisect``.

    ``x = (alpha-1)(z - max)``; tau in ``[-1, -(1/n)^(alpha-1)]`` with n the number of
    candidates ``x > -1``; a fixed number of halvings (a ``Loop``), then
    ``p = max(x - tau_lo, 0)^(1/(alpha-1))`` renormalised to sum 1.
    """
    am1 = g.op("Sub", alpha, g.const(1.0), out="alpha_minus_1")
    inv = g.op("Reciprocal", am1, out="inv_alpha_minus_1")
    x = g.op("Mul", _shifted(g, z), am1, out="entmax_x")
    axes = g.const([-1], np.int64)
    n_cand = g.op("ReduceSum", g.op("Cast", g.op("Greater", x, g.const(-1.0)), to=g.onnx_dtype), axes, keepdims=1)
    n1 = g.op("Max", n_cand, g.const(1.0))
    tau_lo0 = g.op("Expand", g.const(-1.0), g.op("Shape", n1), out="tau_lo_init")
    tau_hi = g.op("Neg", g.op("Pow", n1, g.op("Neg", am1)))
    dm0 = g.op("Sub", tau_hi, tau_lo0, out="dm_init")

    # Loop body: (iter, cond, tau_lo, dm) -> (cond, tau_lo', dm'); x and inv come from the outer scope.
    b = GraphBuilder(f"{g.name}_bisect", g.dtype, prefix="bisect_")
    b.input("iter", TensorProto.INT64, [])
    b.input("cond_in", TensorProto.BOOL, [])
    b.input("tau_lo_in", None, ROW_STAT_SHAPE)
    b.input("dm_in", None, ROW_STAT_SHAPE)
    dm = b.op("Mul", "dm_in", b.const(0.5), out="dm_out")
    tau_m = b.op("Add", "tau_lo_in", dm)
    pm = b.op("Pow", b.op("Relu", b.op("Sub", x, tau_m)), inv)
    f = b.op("ReduceSum", pm, b.const([-1], np.int64), keepdims=1)
    b.op("Where", b.op("GreaterOrEqual", f, b.const(1.0)), tau_m, "tau_lo_in", out="tau_lo_out")
    b.op("Identity", "cond_in", out="cond_out")
    b.output("cond_out", [], elem_type=TensorProto.BOOL)
    b.output("tau_lo_out", ROW_STAT_SHAPE)
    b.output("dm_out", ROW_STAT_SHAPE)
    body = onnx.helper.make_graph(b.nodes, b.name, b.inputs, b.outputs, initializer=b.initializers)

    trips = g.const(BISECT_ITERATIONS, np.int64)
    tau_lo, _ = g.op("Loop", trips, g.const(True, np.bool_), tau_lo0, dm0, out=["tau_lo", "dm_final"], body=body)
    p = g.op("Pow", g.op("Relu", g.op("Sub", x, tau_lo)), inv)
    return _safe_normalize(g, p)


# Each maps the scores (-inf where masked) to the weights; rows without a key come out 0
# (no inf - inf, no 0/0). softmax is built inline in _build_primitive.
NORMALIZER_BUILDERS: dict[str, Callable[[GraphBuilder, str], str]] = {
    "sparsemax": _normalize_sparsemax,
    "entmax15": _normalize_entmax15,
    "entmax": _normalize_entmax_bisect,
}


def _build_primitive(g: GraphBuilder, *, normalizer: str) -> None:
    ins = _declare_inputs(g, alpha=normalizer == "entmax")
    q, mask_bias = _scaled_query_and_mask_bias(g, ins)
    # Grouped-query attention without copying K/V: the G query heads of one kv head are
    # contiguous, so (B, Hq, L, E) reshapes to (B, Hkv, G*L, E) and one MatMul serves them.
    b_hkv = _shape(g, ins.key, 0, 2)
    s_dim = _shape(g, ins.key, 2, 3)
    b_hq_l = _shape(g, ins.query, 0, 3)
    minus1 = g.const([-1], np.int64)
    q_grouped = g.op("Reshape", q, g.op("Concat", b_hkv, minus1, _shape(g, ins.query, 3, 4), axis=0))
    k_t = g.op("Transpose", ins.key, perm=[0, 1, 3, 2])
    z_grouped = g.op("MatMul", q_grouped, k_t)
    z_raw = g.op("Reshape", z_grouped, g.op("Concat", b_hq_l, s_dim, axis=0))
    if normalizer == "softmax":
        # Softmax of an all -inf row is NaN in ONNX Runtime, and NaN * 0 stays NaN: rows
        # without a key get bias 0 for the Softmax (their raw scores, finite), are zeroed
        # after it, and get -inf in the scores output (one more pass over (B, Hq, L, S)).
        has_key = _row_has_key(g, mask_bias)
        row_bias = g.op("Where", has_key, g.const(0.0), g.const(-np.inf))
        z = g.op("Add", z_raw, g.op("Where", has_key, mask_bias, g.const(0.0)))
        g.op("Add", z, row_bias, out="scores")
        g.op("Softmax", z, axis=-1, out="softmax")
        _zero_empty_rows(g, "softmax", has_key, out="weights")
    elif normalizer == "entmax" and g.dtype == "float32":
        g.op("Add", z_raw, mask_bias, out="scores")
        # Near the support boundary p = (x - tau)^(1/(alpha-1)) amplifies float32 rounding of
        # x - tau (for alpha = 3, 3e-8 becomes 2e-4): bisect in float64, as numpy does.
        z64 = g.op("Cast", "scores", to=TensorProto.DOUBLE)
        with g.computing_in("float64"):
            alpha64 = g.op("Cast", "alpha", to=TensorProto.DOUBLE)
            p64 = _normalize_entmax_bisect(g, z64, alpha=alpha64)
        g.op("Cast", p64, to=TensorProto.FLOAT, out="weights")
    else:
        g.op("Add", z_raw, mask_bias, out="scores")
        p = NORMALIZER_BUILDERS[normalizer](g, "scores")
        g.rename(p, "weights")  # no Identity: ONNX Runtime would copy (B, Hq, L, S)
    p_grouped = g.op("Reshape", "weights", g.op("Concat", b_hkv, minus1, s_dim, axis=0))
    y_grouped = g.op("MatMul", p_grouped, ins.value)
    g.op("Reshape", y_grouped, g.op("Concat", b_hq_l, _shape(g, ins.value, 3, 4), axis=0), out="output")
    g.output("output", OUT_SHAPE, "A V, zero for fully masked rows")
    g.output("weights", ROW_SHAPE, f"attention weights ({normalizer}), exactly 0 where masked")
    g.output("scores", ROW_SHAPE, "normalizer input (scale Q K^T + bias) / T, -inf where masked")


def _build_relu(g: GraphBuilder) -> None:
    """ReLU attention, its scores and weights formed in float64 (both dtypes), as the numpy engine does.

    ``relu(y / T) / sum relu(y / T)`` with ``y = scale Q K^T + bias`` does not depend on T > 0, so
    the weights are computed from y without the temperature: a temperature of 1e300 (whose scores
    underflow float32) or 1e-40 (whose scores overflow it) cannot turn a row into zeros. scale and
    temperature are float64 inputs for the same reason (a scale of 1e-46 is 0 in float32). The
    scores output is ``y / T`` rounded once to the graph's dtype.
    """
    ins = _declare_inputs(g, factors=TensorProto.DOUBLE)
    assert ins.keep is not None and ins.bias is not None
    b_hkv = _shape(g, ins.key, 0, 2)
    s_dim = _shape(g, ins.key, 2, 3)
    b_hq_l = _shape(g, ins.query, 0, 3)
    minus1 = g.const([-1], np.int64)
    wide = g.dtype != "float64"
    q, k, bias = ins.query, ins.key, ins.bias
    if wide:
        q, k, bias = (g.op("Cast", x, to=TensorProto.DOUBLE) for x in (q, k, bias))
    with g.computing_in("float64"):
        q_grouped = g.op("Reshape", q, g.op("Concat", b_hkv, minus1, _shape(g, ins.query, 3, 4), axis=0))
        raw = g.op("MatMul", q_grouped, g.op("Transpose", k, perm=[0, 1, 3, 2]))
        raw = g.op("Reshape", raw, g.op("Concat", b_hq_l, s_dim, axis=0))
        y = g.op("Add", g.op("Mul", raw, ins.scale), bias)
        y = g.op("Where", ins.keep, y, g.const(-np.inf))
        scores = g.op("Div", y, ins.temperature, out=None if wide else "scores")
        weights = _normalize_relu(g, y)
    if wide:
        g.op("Cast", scores, to=g.onnx_dtype, out="scores")
        g.op("Cast", weights, to=g.onnx_dtype, out="weights")
    else:
        g.rename(weights, "weights")
    p_grouped = g.op("Reshape", "weights", g.op("Concat", b_hkv, minus1, s_dim, axis=0))
    y_grouped = g.op("MatMul", p_grouped, ins.value)
    g.op("Reshape", y_grouped, g.op("Concat", b_hq_l, _shape(g, ins.value, 3, 4), axis=0), out="output")
    g.output("output", OUT_SHAPE, "A V, zero for fully masked rows")
    g.output("weights", ROW_SHAPE, "attention weights (relu, computed in float64), exactly 0 where masked")
    g.output("scores", ROW_SHAPE, "normalizer input (scale Q K^T + bias) / T, -inf where masked")


# ---------------------------------------------------------------------- backward


GRAD_WEIGHTS_SHAPE = ["gw_batch", "gw_heads", "gw_q_len", "gw_kv_len"]
BACKWARD_OUTPUTS = ("grad_query", "grad_key", "grad_value", "output", "weights", "scores", "grad_scores")


def _build_softmax_backward(g: GraphBuilder) -> None:
    """Softmax attention and its backward (semantics.md, "Gradients") in one graph.

    The forward part is the primitive softmax graph's (grouped-query MatMuls, rows
    without a key zeroed); then, with ``G = (B, Hkv, group * L, .)`` views:
    ``dV = A^T dO``, ``dA = dO V^T + grad_weights``, ``dZ = A (dA - sum(A dA))``
    (softmax's VJP; 0 where masked since A is), ``dQ = (scale/T) dZ K``,
    ``dK = (scale/T) dZ^T Q``. ``grad_scores`` is ``dZ``, from which the engine
    derives the mask, scale and temperature gradients.
    """
    ins = _declare_inputs(g)
    grad_output = g.input("grad_output", None, OUT_SHAPE, "dL/d output, the output's shape")
    grad_weights = g.input(
        "grad_weights",
        None,
        GRAD_WEIGHTS_SHAPE,
        "dL/d weights, broadcastable to (batch, q_heads, q_len, kv_len); (1, 1, 1, 1) zeros if none",
    )
    q, mask_bias = _scaled_query_and_mask_bias(g, ins)
    b_hkv = _shape(g, ins.key, 0, 2)
    s_dim = _shape(g, ins.key, 2, 3)
    e_dim = _shape(g, ins.query, 3, 4)
    ev_dim = _shape(g, ins.value, 3, 4)
    b_hq_l = _shape(g, ins.query, 0, 3)
    minus1 = g.const([-1], np.int64)
    grouped_e = g.op("Concat", b_hkv, minus1, e_dim, axis=0)
    grouped_s = g.op("Concat", b_hkv, minus1, s_dim, axis=0)
    grouped_ev = g.op("Concat", b_hkv, minus1, ev_dim, axis=0)
    rows_s = g.op("Concat", b_hq_l, s_dim, axis=0)
    k_t = g.op("Transpose", ins.key, perm=[0, 1, 3, 2])
    z_raw = g.op("Reshape", g.op("MatMul", g.op("Reshape", q, grouped_e), k_t), rows_s)
    # as the forward softmax graph: rows without a key get bias 0 for the Softmax, then are zeroed
    has_key = _row_has_key(g, mask_bias)
    row_bias = g.op("Where", has_key, g.const(0.0), g.const(-np.inf))
    z = g.op("Add", z_raw, g.op("Where", has_key, mask_bias, g.const(0.0)))
    g.op("Add", z, row_bias, out="scores")
    g.op("Softmax", z, axis=-1, out="softmax")
    weights = _zero_empty_rows(g, "softmax", has_key, out="weights")
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


# ---------------------------------------------------------------------- the registry


def _specs() -> list[GraphSpec]:
    specs: list[GraphSpec] = []
    for dtype in DTYPES:
        specs.append(
            GraphSpec(
                name=f"softmax_fused_nomask_{dtype_tag(dtype)}",
                dtype=dtype,
                normalizer="softmax",
                fused=True,
                outputs=("output",),
                build=lambda g: _build_fused(g, weights=False, masked=False),
                masked=False,
                description=f"Softmax attention on the ONNX Attention operator (opset {OPSET}), {dtype}, output only, "
                "no mask inputs (requests without mask, causal or key_lengths).",
            )
        )
        specs.append(
            GraphSpec(
                name=f"softmax_fused_{dtype_tag(dtype)}",
                dtype=dtype,
                normalizer="softmax",
                fused=True,
                outputs=("output",),
                build=lambda g: _build_fused(g, weights=False),
                description=f"Softmax attention on the ONNX Attention operator (opset {OPSET}), {dtype}, output only.",
            )
        )
        specs.append(
            GraphSpec(
                name=f"softmax_fused_weights_{dtype_tag(dtype)}",
                dtype=dtype,
                normalizer="softmax",
                fused=True,
                outputs=("output", "weights"),
                build=lambda g: _build_fused(g, weights=True),
                description=f"Softmax attention on the ONNX Attention operator (opset {OPSET}), {dtype}, "
                "output and weights.",
            )
        )
    for normalizer in ("softmax", "sparsemax", "entmax15", "entmax", "relu"):
        for dtype in DTYPES:
            specs.append(
                GraphSpec(
                    name=f"{normalizer}_{dtype_tag(dtype)}",
                    dtype=dtype,
                    normalizer=normalizer,
                    fused=False,
                    outputs=("output", "weights", "scores"),
                    build=_build_relu if normalizer == "relu" else partial(_build_primitive, normalizer=normalizer),
                    description=(
                        f"{normalizer} attention from primitive ONNX operators, {dtype}: output, weights and scores"
                        + (
                            f"; alpha is an input, {BISECT_ITERATIONS} bisection steps in float64"
                            if normalizer == "entmax"
                            else ""
                        )
                        + (
                            "; computed in float64 with float64 scale and temperature inputs, the temperature "
                            "left out of the weights (relu is invariant to it)"
                            if normalizer == "relu"
                            else ""
                        )
                        + "."
                    ),
                )
            )
    for dtype in DTYPES:
        specs.append(
            GraphSpec(
                name=f"softmax_backward_{dtype_tag(dtype)}",
                dtype=dtype,
                normalizer="softmax",
                fused=False,
                outputs=BACKWARD_OUTPUTS,
                build=_build_softmax_backward,
                backward=True,
                description=f"Softmax attention and its backward pass from primitive ONNX operators, {dtype}: "
                "the gradients of query, key and value, and output, weights, scores and their gradient.",
            )
        )
    return specs


def dtype_tag(dtype: str) -> str:
    """``float32`` -> ``f32``."""
    return {"float32": "f32", "float64": "f64"}[dtype]


GRAPHS: tuple[GraphSpec, ...] = tuple(_specs())

__all__ = ["BISECT_ITERATIONS", "GRAPHS", "GraphSpec", "IR_VERSION", "OPSET", "dtype_tag"]
