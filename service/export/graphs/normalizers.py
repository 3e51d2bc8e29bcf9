"""The normalizers as ONNX subgraphs: scores (-inf where masked) in, weights out (rows without a key 0)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
from onnx import TensorProto

from service.core.normalizers import NEAR_ONE
from service.export.builder import GraphBuilder
from service.export.graphs.common import dim_slice
from service.export.graphs.spec import BISECT_ITERATIONS, ROW_SHAPE, ROW_STAT_SHAPE


def shifted(g: GraphBuilder, z: str) -> str:
    """``z - rowmax`` over the finite entries; a fully masked row stays all -inf (never NaN)."""
    m = g.op("ReduceMax", z, g.const([-1], np.int64), keepdims=1)
    m_safe = g.op("Max", m, g.const(np.finfo(g.np_dtype).min))
    return g.op("Sub", z, m_safe)


def _sorted_candidates(g: GraphBuilder, x: str) -> tuple[str, str, str]:
    """``x`` (row max 0) sorted descending; entries <= -1 can never be in the support
    (tau >= -1 for sparsemax, entmax15 and alpha-entmax) and are replaced by 0 and flagged.

    Returns (sorted values with non-candidates 0, candidate flags, k = 1..n as dtype).
    """
    n = dim_slice(g, x, 3, 4)
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
    x = shifted(g, z)
    srt0, cand, k = _sorted_candidates(g, x)
    c = g.op("Sub", g.op("CumSum", srt0, g.const(-1, np.int64)), g.const(1.0))
    support = g.op("And", g.op("Greater", g.op("Mul", k, srt0), c), cand)
    c_k, size1 = _gather_at_support(g, c, support)
    tau = g.op("Div", c_k, size1)
    return g.op("Relu", g.op("Sub", x, tau))


def _normalize_entmax15(g: GraphBuilder, z: str) -> str:
    x = g.op("Mul", shifted(g, z), g.const(0.5))
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


def normalize_relu(g: GraphBuilder, z: str) -> str:
    """``relu(z) / sum relu(z)``, each row first scaled by its largest relu value, as the numpy
    reference does: the sum of three scores of 3e38 overflows float32, the scaled sum (3) does not.
    Not shift invariant, so no max subtraction; masked entries are -inf -> relu 0.
    """
    r = g.op("Relu", z)
    m = g.op("ReduceMax", r, g.const([-1], np.int64), keepdims=1)
    m_safe = g.op("Where", g.op("Greater", m, g.const(0.0)), m, g.const(1.0))
    return _safe_normalize(g, g.op("Div", r, m_safe))


def normalize_entmax_bisect(g: GraphBuilder, z: str, alpha: str = "alpha") -> str:
    """alpha-entmax by bisection on tau, as the entmax package's ``entmax_bisect``.

    ``x = (alpha-1)(z - max)``; tau in ``[-1, -(1/n)^(alpha-1)]`` with n the number of
    candidates ``x > -1``; a fixed number of halvings (a ``Loop``), then
    ``p = max(x - tau_lo, 0)^(1/(alpha-1))`` renormalised to sum 1. Below ``alpha - 1 =``
    :data:`~service.core.normalizers.NEAR_ONE` an ``If`` takes the near-one branch instead
    (:func:`_entmax_near_one_branch`), as the numpy reference does.
    """
    am1 = g.op("Sub", alpha, g.const(1.0), out="alpha_minus_1")
    inv = g.op("Reciprocal", am1, out="inv_alpha_minus_1")
    x = g.op("Mul", shifted(g, z), am1, out="entmax_x")
    axes = g.const([-1], np.int64)
    n_cand = g.op("ReduceSum", g.op("Cast", g.op("Greater", x, g.const(-1.0)), to=g.onnx_dtype), axes, keepdims=1)
    n1 = g.op("Max", n_cand, g.const(1.0), out="entmax_n")
    near_one = g.op("Less", am1, g.const(NEAR_ONE), out="alpha_near_one")
    p = g.op(
        "If",
        near_one,
        out="entmax_p",
        then_branch=_entmax_near_one_branch(g, x, n1, am1, inv),
        else_branch=_entmax_power_branch(g, x, n1, am1, inv),
    )
    return _safe_normalize(g, p)


def _bisection_loop(
    g: GraphBuilder, prefix: str, init: tuple[str, str], mass: Callable[[GraphBuilder, str], str]
) -> onnx.GraphProto:
    """The ``Loop`` body ``(iter, cond, lo, dm) -> (cond, lo', dm')``: ``dm' = dm / 2``, ``lo' = lo + dm'`` where
    the unnormalised mass ``mass(b, lo + dm')`` is still >= 1. Outer values come from the enclosing scopes.
    """
    b = GraphBuilder(f"{g.name}_{prefix}bisect", g.dtype, prefix=f"{prefix}bisect_")
    b.input("iter", TensorProto.INT64, [])
    b.input("cond_in", TensorProto.BOOL, [])
    b.input(f"{init[0]}_in", None, ROW_STAT_SHAPE)
    b.input("dm_in", None, ROW_STAT_SHAPE)
    dm = b.op("Mul", "dm_in", b.const(0.5), out="dm_out")
    mid = b.op("Add", f"{init[0]}_in", dm)
    f = b.op("ReduceSum", mass(b, mid), b.const([-1], np.int64), keepdims=1)
    b.op("Where", b.op("GreaterOrEqual", f, b.const(1.0)), mid, f"{init[0]}_in", out=f"{init[0]}_out")
    b.op("Identity", "cond_in", out="cond_out")
    b.output("cond_out", [], elem_type=TensorProto.BOOL)
    b.output(f"{init[0]}_out", ROW_STAT_SHAPE)
    b.output("dm_out", ROW_STAT_SHAPE)
    return onnx.helper.make_graph(b.nodes, b.name, b.inputs, b.outputs, initializer=b.initializers)


def _branch(g: GraphBuilder, prefix: str) -> GraphBuilder:
    return GraphBuilder(f"{g.name}_{prefix}branch", g.dtype, prefix=prefix)


def _finish_branch(b: GraphBuilder, p: str) -> onnx.GraphProto:
    b.output(p, ROW_SHAPE)
    return onnx.helper.make_graph(b.nodes, b.name, [], b.outputs, initializer=b.initializers)


def _entmax_power_branch(g: GraphBuilder, x: str, n1: str, am1: str, inv: str) -> onnx.GraphProto:
    """``p = max(x - tau, 0)^(1/(alpha-1))``, tau bisected on ``[-1, -(1/n)^(alpha-1)]`` (alpha - 1 >= NEAR_ONE)."""
    e = _branch(g, "power_")
    tau_lo0 = e.op("Expand", e.const(-1.0), e.op("Shape", n1), out="tau_lo_init")
    tau_hi = e.op("Neg", e.op("Pow", n1, e.op("Neg", am1)))
    dm0 = e.op("Sub", tau_hi, tau_lo0, out="dm_init")
    body = _bisection_loop(g, "", ("tau_lo", "dm"), lambda b, tau: b.op("Pow", b.op("Relu", b.op("Sub", x, tau)), inv))
    trips = e.const(BISECT_ITERATIONS, np.int64)
    tau_lo, _ = e.op("Loop", trips, e.const(True, np.bool_), tau_lo0, dm0, out=["tau_lo", "dm_final"], body=body)
    return _finish_branch(e, e.op("Pow", e.op("Relu", e.op("Sub", x, tau_lo)), inv, out="power_p"))


def _log1p_power(b: GraphBuilder, v: str, inv: str) -> str:
    """``max(1 + v, 0)^inv`` as ``exp(log1p(v) inv)``, with Kahan's ``log1p(v) = v log(u) / (u - 1)``, ``u = 1 + v``
    (``v`` itself where ``u`` rounds to 1): ONNX has no Log1p, and ``log(1 + v)`` loses tiny v to rounding.
    """
    v = b.op("Max", v, b.const(-1.0))
    u = b.op("Add", v, b.const(1.0))
    d = b.op("Sub", u, b.const(1.0))
    log1p = b.op("Where", b.op("Equal", d, b.const(0.0)), v, b.op("Mul", b.op("Log", u), b.op("Div", v, d)))
    return b.op("Exp", b.op("Mul", log1p, inv))


def _entmax_near_one_branch(g: GraphBuilder, x: str, n1: str, am1: str, inv: str) -> onnx.GraphProto:
    """Alpha - 1 below NEAR_ONE: ``tau = (alpha-1) lam - 1`` and ``p = exp(log1p(x - (alpha-1) lam) / (alpha-1))``,
    lam bisected on ``[0, ln n]`` (the numpy reference's near-one form; ``1 + x - tau`` would lose x to rounding).
    """
    t = _branch(g, "near1_")
    lam_lo0 = t.op("Expand", t.const(0.0), t.op("Shape", n1), out="lam_lo_init")
    dm0 = t.op("Log", n1, out="dm_init")

    def mass(b: GraphBuilder, lam: str) -> str:
        return _log1p_power(b, b.op("Sub", x, b.op("Mul", lam, am1)), inv)

    body = _bisection_loop(g, "near1_", ("lam_lo", "dm"), mass)
    trips = t.const(BISECT_ITERATIONS, np.int64)
    lam_lo, _ = t.op("Loop", trips, t.const(True, np.bool_), lam_lo0, dm0, out=["lam_lo", "dm_final"], body=body)
    p = _log1p_power(t, t.op("Sub", x, t.op("Mul", lam_lo, am1)), inv)
    return _finish_branch(t, t.op("Identity", p, out="near1_p"))


# Each maps the scores (-inf where masked) to the weights; rows without a key come out 0
# (no inf - inf, no 0/0). softmax is built inline in build_primitive.
NORMALIZER_BUILDERS: dict[str, Callable[[GraphBuilder, str], str]] = {
    "sparsemax": _normalize_sparsemax,
    "entmax15": _normalize_entmax15,
    "entmax": normalize_entmax_bisect,
}
