"""Parity: the ONNX engine against the numpy reference engine and the golden cases.

Tolerances (absolute and relative, on output and weights; scores likewise, with
-inf at exactly the same positions):

- float64: 1e-10. Both engines compute in float64 with the same formulas; what
  differs is only the summation order inside MatMul and the reductions (observed
  differences are ~1e-15). Golden cases use the file's own 1e-8 (1e-6 for
  bisection entmax).
- float32: 1e-5. The numpy engine computes the sort-based normalizers
  in float64 internally while those graphs stay in float32 (the entmax bisection
  graph computes in float64 too), and the MatMul kernels
  differ (OpenBLAS against MLAS): observed differences ~1e-6.
- float32 with large scores (|z| ~ 1e4): a score carries an absolute rounding
  error of ~1e4 * 2^-24 * sqrt(E) in either engine, so weights are compared with
  atol 1e-3 there; the float64 large-score cases keep 1e-10.

Masked positions must be exactly 0 in both engines, and fully masked rows
exactly zero in output and weights (never NaN, never the mean of V).
"""

from __future__ import annotations

import itertools
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from service.core.errors import NumericalError
from service.core.types import AttentionInputs, AttentionParams, AttentionResult, AttentionTask
from service.engines.numpy_engine import NumpyEngine
from service.engines.onnx_engine import OnnxEngine
from service.export import DEFAULT_MODELS_DIR
from tests import golden

TOL = {"float32": 1e-5, "float64": 1e-10}
LARGE_F32_TOL = 1e-3

NORMALIZERS = [
    ("softmax", None),
    ("sparsemax", None),
    ("entmax15", None),
    ("entmax", 1.25),
    ("entmax", 1.5),
    ("entmax", 2.0),
    ("entmax", 3.0),
    ("relu", None),
]
NORM_IDS = [n if a is None else f"{n}{a}" for n, a in NORMALIZERS]
# (B, Hq, Hkv, L, S, E, Ev): L < S, L > S, L = 1, L = S, with MHA, GQA and MQA
SHAPES = [
    (2, 4, 2, 3, 7, 8, 6),
    (2, 2, 2, 7, 3, 8, 8),
    (3, 4, 1, 1, 9, 16, 5),
    (1, 6, 3, 5, 5, 4, 4),
]
MASKS = ["none", "bool", "float", "key_lengths"]
CAUSAL = [None, "top_left", "bottom_right"]


@pytest.fixture(scope="module")
def onnx_engine() -> OnnxEngine:
    engine = OnnxEngine(DEFAULT_MODELS_DIR)
    engine.start()
    assert engine.ready, engine.describe()
    return engine


NUMPY = NumpyEngine()


def make_task(
    rng: np.random.Generator,
    shape: tuple[int, ...],
    *,
    normalizer: str = "softmax",
    alpha: float | None = None,
    mask: str = "none",
    causal: str | None = None,
    dtype: str = "float32",
    rank: int = 4,
    magnitude: float = 1.0,
    temperature: float = 0.8,
    scale: float | None = None,
    need_weights: bool = True,
    need_scores: bool = True,
    fully_masked_row: bool = False,
) -> AttentionTask:
    B, Hq, Hkv, L, S, E, Ev = shape
    q = rng.standard_normal((B, Hq, L, E)) * magnitude
    k = rng.standard_normal((B, Hkv, S, E))
    v = rng.standard_normal((B, Hkv, S, Ev))
    m = None
    key_lengths = None
    if mask == "bool":
        m = rng.random((B, 1, L, S)) > 0.3
        if fully_masked_row:
            m[0, 0, L // 2] = False
    elif mask == "float":
        m = rng.standard_normal((1, Hq, L, S))
        m[rng.random(m.shape) < 0.25] = -np.inf
        if fully_masked_row:
            m[0, -1, 0] = -np.inf
    elif mask == "key_lengths":
        key_lengths = rng.integers(1, S + 1, size=B)
        if fully_masked_row:
            key_lengths[-1] = 0
    if rank < 4:
        assert B == 1 and (rank == 3 or Hq == Hkv == 1)
        q, k, v = (x.reshape(x.shape[4 - rank :]) for x in (q, k, v))
        if m is not None:
            m = m.reshape(m.shape[4 - rank :]) if m.shape[0] == 1 else m
    return AttentionTask(
        inputs=AttentionInputs(query=q, key=k, value=v, mask=m, key_lengths=key_lengths),
        params=AttentionParams(normalizer=normalizer, alpha=alpha, scale=scale, temperature=temperature, causal=causal),
        dtype=np.dtype(dtype),
        need_weights=need_weights,
        need_scores=need_scores,
    )


def assert_parity(got: AttentionResult, want: AttentionResult, tol: float, *, weights_tol: float | None = None) -> None:
    assert got.output.shape == want.output.shape and got.output.dtype == want.output.dtype
    np.testing.assert_allclose(got.output, want.output, rtol=tol, atol=tol)
    np.testing.assert_array_equal(got.valid_keys, want.valid_keys)
    assert np.isfinite(got.output).all()
    empty = got.valid_keys == 0
    out4 = got.output.reshape(empty.shape + (-1,))
    assert (out4[empty] == 0).all(), "fully masked rows must give an all-zero output"
    assert (got.weights is None) == (want.weights is None)
    if want.weights is not None:
        assert got.weights.shape == want.weights.shape and got.weights.dtype == want.weights.dtype
        wt = tol if weights_tol is None else weights_tol
        np.testing.assert_allclose(got.weights, want.weights, rtol=wt, atol=wt)
        assert (got.weights.reshape(empty.shape + (-1,))[empty] == 0).all()
        if want.scores is not None:  # masked positions (score -inf) get exactly 0
            assert (got.weights[np.isneginf(want.scores)] == 0).all()
    assert (got.scores is None) == (want.scores is None)
    if want.scores is not None:
        np.testing.assert_array_equal(np.isneginf(got.scores), np.isneginf(want.scores))
        finite = np.isfinite(want.scores)
        scale = max(1.0, float(np.abs(want.scores[finite]).max(initial=0.0)))
        np.testing.assert_allclose(got.scores[finite], want.scores[finite], rtol=tol, atol=tol * scale)


def check(engine: OnnxEngine, task: AttentionTask, **kw) -> AttentionResult:
    assert engine.unsupported_reason(task) is None
    got = engine.run(task)
    assert_parity(got, NUMPY.run(task), TOL[task.dtype.name], **kw)
    return got


# ------------------------------------------------------------------------------ the matrix


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize(("normalizer", "alpha"), NORMALIZERS, ids=NORM_IDS)
def test_parity_every_normalizer_mask_and_causal_alignment(onnx_engine: OnnxEngine, normalizer, alpha, dtype) -> None:
    rng = np.random.default_rng(zlib.crc32(f"{normalizer}{alpha}{dtype}".encode()))
    for i, (mask, causal) in enumerate(itertools.product(MASKS, CAUSAL)):
        shape = SHAPES[i % len(SHAPES)]
        task = make_task(rng, shape, normalizer=normalizer, alpha=alpha, mask=mask, causal=causal, dtype=dtype)
        check(onnx_engine, task)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "B{}Hq{}Hkv{}L{}S{}E{}Ev{}".format(*s))
@pytest.mark.parametrize("causal", CAUSAL)
def test_parity_softmax_every_shape_and_output_set(onnx_engine: OnnxEngine, shape, causal, dtype) -> None:
    """Output only (the fused graph; without mask inputs when nothing masks), with weights (fused,
    weights out) and with scores (primitive).
    """
    rng = np.random.default_rng(7)
    for need_weights, need_scores, graph in [
        (False, False, "softmax_fused_nomask_" if causal is None else "softmax_fused_f"),
        (True, False, "softmax_fused_weights_"),
        (True, True, "softmax_f"),
    ]:
        task = make_task(
            rng,
            shape,
            mask="none" if causal is None else "bool",
            causal=causal,
            dtype=dtype,
            need_weights=need_weights,
            need_scores=need_scores,
        )
        assert onnx_engine.graph_for(task).startswith(graph)
        check(onnx_engine, task)


@pytest.mark.parametrize("rank", [2, 3])
@pytest.mark.parametrize(("normalizer", "alpha"), [("softmax", None), ("entmax15", None), ("entmax", 1.7)])
def test_parity_lower_ranks(onnx_engine: OnnxEngine, rank, normalizer, alpha) -> None:
    rng = np.random.default_rng(rank)
    shape = (1, 1, 1, 6, 4, 8, 3) if rank == 2 else (1, 3, 3, 6, 4, 8, 3)
    for need_weights in (False, True):
        task = make_task(
            rng,
            shape,
            normalizer=normalizer,
            alpha=alpha,
            mask="bool",
            causal="bottom_right",
            rank=rank,
            need_weights=need_weights,
        )
        got = check(onnx_engine, task)
        assert got.output.ndim == rank


# ------------------------------------------------------------------------------ edge cases


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize(("normalizer", "alpha"), NORMALIZERS, ids=NORM_IDS)
def test_fully_masked_rows_are_zero(onnx_engine: OnnxEngine, normalizer, alpha, dtype) -> None:
    rng = np.random.default_rng(11)
    for mask in ("bool", "float", "key_lengths"):
        for need_weights in (False, True):
            task = make_task(
                rng,
                SHAPES[0],
                normalizer=normalizer,
                alpha=alpha,
                mask=mask,
                dtype=dtype,
                fully_masked_row=True,
                need_weights=need_weights,
                need_scores=need_weights,
            )
            got = check(onnx_engine, task)
            assert (got.valid_keys == 0).any()
    # bottom_right with L > S leaves the first L - S query rows without a key
    task = make_task(rng, (1, 2, 2, 6, 3, 4, 4), normalizer=normalizer, alpha=alpha, causal="bottom_right", dtype=dtype)
    got = check(onnx_engine, task)
    assert (got.valid_keys[..., :3] == 0).all() and (got.output[..., :3, :] == 0).all()
    assert (got.weights[..., :3, :] == 0).all() and np.isneginf(got.scores[..., :3, :]).all()


def test_everything_masked(onnx_engine: OnnxEngine) -> None:
    rng = np.random.default_rng(3)
    for normalizer, alpha in NORMALIZERS:
        task = make_task(rng, SHAPES[1], normalizer=normalizer, alpha=alpha, mask="bool")
        task.inputs.mask = np.zeros_like(task.inputs.mask)
        got = check(onnx_engine, task)
        assert not got.output.any() and not got.weights.any() and np.isneginf(got.scores).all()


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize(("normalizer", "alpha"), NORMALIZERS, ids=NORM_IDS)
def test_large_scores(onnx_engine: OnnxEngine, normalizer, alpha, dtype) -> None:
    """|scores| ~ 1e4: the row max is subtracted first, masks stay masks (no finite sentinel leaks)."""
    rng = np.random.default_rng(5)
    for mask, causal in [("bool", None), ("float", "bottom_right"), ("key_lengths", "top_left")]:
        task = make_task(
            rng,
            SHAPES[0],
            normalizer=normalizer,
            alpha=alpha,
            mask=mask,
            causal=causal,
            dtype=dtype,
            magnitude=1e4 / np.sqrt(8),
            temperature=1.0,
        )
        got = onnx_engine.run(task)
        want = NUMPY.run(task)
        finite = np.isfinite(want.scores)
        assert np.abs(want.scores[finite]).max() > 5e3
        if dtype == "float64":
            assert_parity(got, want, TOL[dtype])
        else:
            rel = LARGE_F32_TOL
            np.testing.assert_allclose(got.weights, want.weights, atol=rel, rtol=rel)
            np.testing.assert_allclose(got.output, want.output, atol=rel * 10, rtol=rel)
            np.testing.assert_array_equal(np.isneginf(got.scores), np.isneginf(want.scores))
        keep = np.isfinite(want.scores)
        assert (got.weights[~keep] == 0).all(), "masked positions must get exactly 0"


def test_explicit_scale_and_temperature(onnx_engine: OnnxEngine) -> None:
    rng = np.random.default_rng(9)
    for normalizer, alpha in NORMALIZERS:
        for scale, temperature in [(0.05, 3.0), (2.0, 0.25)]:
            for need_weights in (False, True):
                task = make_task(
                    rng,
                    SHAPES[0],
                    normalizer=normalizer,
                    alpha=alpha,
                    mask="float",
                    dtype="float64",
                    scale=scale,
                    temperature=temperature,
                    need_weights=need_weights,
                )
                check(onnx_engine, task)


@pytest.mark.parametrize(("scale", "temperature"), [(1e-40, 1.0), (1e-25, 1e24)])
def test_float32_scale_over_temperature_below_the_normal_range(
    onnx_engine: OnnxEngine, scale: float, temperature: float
) -> None:
    """The float32 graphs take scale / T as float32, where 1e-40 is subnormal and 1e-49 is 0: the engine
    scales the query in float64 instead, and agrees with numpy (and float64) on scores of order 1.
    """
    rng = np.random.default_rng(12)
    big = (scale / temperature) ** -0.5
    for normalizer, alpha in NORMALIZERS:
        task = make_task(
            rng, SHAPES[0], normalizer=normalizer, alpha=alpha, mask="float", scale=scale, temperature=temperature
        )
        task.inputs.query *= big
        task.inputs.key *= big
        got = check(onnx_engine, task)
        exact = NUMPY.run(AttentionTask(task.inputs, task.params, np.dtype(np.float64), True, True))
        np.testing.assert_allclose(got.weights, exact.weights, rtol=1e-5, atol=1e-5)
        assert np.ptp(exact.weights, axis=-1).max() > 0.1  # not the uniform rows of a factor rounded to 0


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    normalizer=st.sampled_from(NORMALIZERS),
    score_exp=st.integers(-8, 30),
    factor_exp=st.integers(-60, 37),
    temperature_exp=st.integers(-38, 38),
    mask=st.sampled_from(MASKS),
    causal=st.sampled_from(CAUSAL),
    seed=st.integers(0, 2**31),
)
def test_float32_is_float64_rounded_at_extreme_scales(
    onnx_engine: OnnxEngine, normalizer, score_exp, factor_exp, temperature_exp, mask, causal, seed
) -> None:
    """A float32 answer is float64's to float32 precision, or both engines refuse it, at any scale / T.

    Scores of 1e-8 to 1e30 reached with scale / T anywhere from 1e-60 to 1e37 (queries and keys sized
    to match, within float32), on numpy and ONNX; a score carries |z| * 2^-24 of rounding. Never a
    silently flattened row: this is how the rounding of scale / T to 0 in float32 was found. (Beyond
    ~1e30 a float32 GEMM may overflow in its partial sums, as MLAS did at 3.2e38 where OpenBLAS did
    not: float32's own limit.)
    """
    size = 10.0 ** ((score_exp - factor_exp) / 2)
    assume(1e-15 <= size <= 1e30)
    temperature = 10.0**temperature_exp
    scale = 10.0**factor_exp * temperature
    name, alpha = normalizer
    rng = np.random.default_rng(seed)
    task = make_task(
        rng, SHAPES[3], normalizer=name, alpha=alpha, mask=mask, causal=causal, scale=scale, temperature=temperature
    )
    task.inputs.query *= size
    task.inputs.key *= size
    task.inputs.query, task.inputs.key, task.inputs.value = (
        x.astype(np.float32) for x in (task.inputs.query, task.inputs.key, task.inputs.value)
    )
    results = {}
    for engine, dtype in ((NUMPY, "float32"), (onnx_engine, "float32"), (NUMPY, "float64")):
        t = AttentionTask(task.inputs, task.params, np.dtype(dtype), True, True)
        try:
            results[engine.name, dtype] = engine.run(t)
        except NumericalError:
            results[engine.name, dtype] = None
    f32, onnx32, f64 = results["numpy", "float32"], results["onnx", "float32"], results["numpy", "float64"]
    assert (f32 is None) == (onnx32 is None), "one engine refused what the other answered"
    if f32 is None or f64 is None:
        return
    finite = np.isfinite(f64.scores)
    atol = 4e-7 * max(1.0, float(np.abs(f64.scores[finite]).max(initial=0.0))) * np.sqrt(SHAPES[3][5])
    np.testing.assert_allclose(f32.weights, f64.weights, rtol=0, atol=atol)
    np.testing.assert_allclose(onnx32.weights, f64.weights, rtol=0, atol=max(atol, 1e-5))
    np.testing.assert_array_equal(f32.valid_keys, f64.valid_keys)


def test_bias_broadcast_shapes(onnx_engine: OnnxEngine) -> None:
    """Float and bool masks of every broadcastable shape: (S,), (L, S), (B,1,1,S), (1,Hq,L,1), full."""
    rng = np.random.default_rng(13)
    B, Hq, Hkv, L, S, E, Ev = SHAPES[0]
    for mshape in [(S,), (L, S), (B, 1, 1, S), (1, Hq, L, 1), (B, Hq, L, S)]:
        for kind in ("bool", "float"):
            for need_weights in (False, True):
                task = make_task(rng, SHAPES[0], need_weights=need_weights, need_scores=need_weights)
                if kind == "bool":
                    task.inputs.mask = rng.random(mshape) > 0.3
                else:
                    m = rng.standard_normal(mshape)
                    m[rng.random(mshape) < 0.2] = -np.inf
                    task.inputs.mask = m
                check(onnx_engine, task)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    data=st.data(),
    normalizer=st.sampled_from(NORMALIZERS),
    dtype=st.sampled_from(["float32", "float64"]),
    causal=st.sampled_from(CAUSAL),
    mask=st.sampled_from(MASKS),
)
def test_parity_random_shapes(onnx_engine: OnnxEngine, data, normalizer, dtype, causal, mask) -> None:
    B = data.draw(st.integers(1, 3))
    Hkv = data.draw(st.integers(1, 3))
    G = data.draw(st.integers(1, 3))
    L = data.draw(st.integers(1, 9))
    S = data.draw(st.integers(1, 9))
    E = data.draw(st.integers(1, 9))
    Ev = data.draw(st.integers(1, 9))
    seed = data.draw(st.integers(0, 2**31))
    need_weights = data.draw(st.booleans())
    task = make_task(
        np.random.default_rng(seed),
        (B, Hkv * G, Hkv, L, S, E, Ev),
        normalizer=normalizer[0],
        alpha=normalizer[1],
        mask=mask,
        causal=causal,
        dtype=dtype,
        need_weights=need_weights,
        need_scores=need_weights,
    )
    check(onnx_engine, task)


# ------------------------------------------------------------------------------ golden cases


@pytest.mark.parametrize("index", range(len(golden.load("attention"))))
def test_golden_cases(onnx_engine: OnnxEngine, index: int) -> None:
    """PyTorch/entmax-computed float64 expectations, no code of ours involved."""
    case = golden.load("attention")[index]
    request = case["request"]
    tol = golden.tolerance(request)
    for need_weights in (False, True):
        task = golden.task_from_request(request, need_weights=need_weights)
        assert onnx_engine.unsupported_reason(task) is None
        got = onnx_engine.run(task)
        np.testing.assert_allclose(got.output, np.array(case["expected"]["output"]), rtol=tol, atol=tol)
        if need_weights:
            np.testing.assert_allclose(got.weights, np.array(case["expected"]["weights"]), rtol=tol, atol=tol)
