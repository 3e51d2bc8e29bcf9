"""Parity of the backward pass: the ONNX backward graph (softmax) against the numpy reference, and dispatch.

Tolerances as the forward parity tests (tests/engines/test_onnx_parity.py): 1e-10 in float64
(observed ~1e-15), 1e-5 in float32 (observed ~3e-7), on every gradient, the output and the weights;
grad_scale and grad_temperature, sums over every score, relative to the sum of magnitudes.
Masked positions and fully masked rows are exactly 0 in both engines.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from service.core.backward import BACKWARD_RETURNS, BackwardResult, BackwardTask
from service.core.errors import InvalidInput
from service.engines.dispatch import EngineDispatcher, EngineUnavailable
from service.engines.numpy_engine import NumpyEngine
from service.engines.onnx_engine import OnnxEngine
from service.export import DEFAULT_MODELS_DIR
from tests import golden
from tests.engines.test_onnx_parity import CAUSAL, MASKS, SHAPES, make_task

TOL = {"float32": 1e-5, "float64": 1e-10}
ALL = frozenset(BACKWARD_RETURNS)
NUMPY = NumpyEngine()


@pytest.fixture(scope="module")
def onnx_engine() -> OnnxEngine:
    engine = OnnxEngine(DEFAULT_MODELS_DIR)
    engine.start()
    assert engine.ready, engine.describe()
    return engine


def backward_task(rng: np.random.Generator, shape, *, dtype: str, want=ALL, grad_weights: bool = True, **kw):
    task = make_task(rng, shape, dtype=dtype, **kw)
    lead = task.inputs.query.shape[:-1]
    Ev, S = task.inputs.value.shape[-1], task.inputs.key.shape[-2]
    if "grad_mask" in want and (task.inputs.mask is None or task.inputs.mask.dtype == bool):
        want = want - {"grad_mask"}
    return BackwardTask(
        task,
        rng.standard_normal(lead + (Ev,)),
        rng.standard_normal(lead + (S,)) if grad_weights else None,
        want=want,
    )


def assert_backward_parity(got: BackwardResult, want: BackwardResult, tol: float) -> None:
    for name in ("grad_query", "grad_key", "grad_value", "grad_mask", "output", "weights"):
        a, b = getattr(got, name), getattr(want, name)
        assert (a is None) == (b is None), name
        if b is None:
            continue
        assert a.shape == b.shape and a.dtype == b.dtype, name
        assert np.isfinite(a).all(), name
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol, err_msg=name)
    empty = want.valid_keys == 0
    if want.grad_query is not None and empty.any():
        assert (got.grad_query.reshape(empty.shape + (-1,))[empty] == 0).all()
    if want.weights is not None:  # masked and zero weights agree exactly
        assert ((got.weights == 0) == (want.weights == 0)).all()
    for name in ("grad_scale", "grad_temperature"):
        a, b = getattr(got, name), getattr(want, name)
        assert (a is None) == (b is None), name
        if b is not None:
            assert a == pytest.approx(b, rel=10 * tol, abs=10 * tol), name
    if want.gradient_health is not None:
        np.testing.assert_allclose(
            got.gradient_health.mean_jacobian_norm, want.gradient_health.mean_jacobian_norm, atol=tol
        )
        np.testing.assert_array_equal(got.gradient_health.rows, want.gradient_health.rows)


CASES = list(itertools.product(range(len(SHAPES)), MASKS, CAUSAL, ("float32", "float64")))


@pytest.mark.parametrize("shape_i,mask,causal,dtype", CASES)
def test_onnx_backward_matches_numpy(onnx_engine: OnnxEngine, shape_i: int, mask: str, causal, dtype: str) -> None:
    rng = np.random.default_rng(shape_i * 100 + MASKS.index(mask) * 10 + CAUSAL.index(causal))
    bt = backward_task(rng, SHAPES[shape_i], dtype=dtype, mask=mask, causal=causal, fully_masked_row=True)
    assert onnx_engine.backward_graph_for(bt) == f"softmax_backward_{dtype.replace('float', 'f')}"
    assert_backward_parity(onnx_engine.run_backward(bt), NUMPY.run_backward(bt), TOL[dtype])


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("rank", [2, 3])
def test_lower_ranks_subsets_and_large_scores(onnx_engine: OnnxEngine, rank: int, dtype: str) -> None:
    rng = np.random.default_rng(rank)
    shape = (1, 1, 1, 5, 7, 8, 3) if rank == 2 else (1, 3, 3, 5, 7, 8, 3)
    for want in (frozenset({"grad_query"}), frozenset({"grad_value", "grad_scale"}), ALL):
        bt = backward_task(rng, shape, dtype=dtype, mask="float", rank=rank, want=want, grad_weights=False)
        got, ref = onnx_engine.run_backward(bt), NUMPY.run_backward(bt)
        assert_backward_parity(got, ref, TOL[dtype])
        if "grad_query" in want:
            assert got.grad_query.shape == bt.task.inputs.query.shape
    # scores of ~1e2 saturate softmax: the gradients are tiny and must still agree (float64)
    bt = backward_task(rng, shape, dtype="float64", magnitude=30.0, rank=rank)
    assert_backward_parity(onnx_engine.run_backward(bt), NUMPY.run_backward(bt), TOL["float64"])


@pytest.mark.parametrize("case", [c for c in golden.load("backward") if c["request"]["normalizer"] == "softmax"])
def test_golden_softmax_backward_on_onnx(onnx_engine: OnnxEngine, case: dict) -> None:
    task = golden.task_from_request(case["request"])
    bt = BackwardTask(task, np.array(case["request"]["grad_output"]))
    got = onnx_engine.run_backward(bt)
    for name in ("grad_query", "grad_key", "grad_value"):
        np.testing.assert_allclose(getattr(got, name), np.array(case["expected"][name]), atol=1e-8, rtol=0)


def test_only_softmax_has_a_backward_graph_and_errors_are_named(onnx_engine: OnnxEngine) -> None:
    rng = np.random.default_rng(0)
    sparse = backward_task(rng, SHAPES[0], dtype="float32", normalizer="sparsemax")
    assert "no ONNX backward graph" in onnx_engine.backward_unsupported_reason(sparse)
    # alpha 2 is sparsemax, alpha 1.5 entmax15: no graph either
    assert onnx_engine.backward_unsupported_reason(
        backward_task(rng, SHAPES[0], dtype="float32", normalizer="entmax", alpha=2.0)
    )
    bt = backward_task(rng, SHAPES[0], dtype="float64")
    bad = BackwardTask(bt.task, np.zeros((1, 1)), want=bt.want)
    with pytest.raises(InvalidInput) as e:
        onnx_engine.run_backward(bad)
    assert e.value.loc == ("grad_output",)
    no_mask = backward_task(rng, SHAPES[0], dtype="float64", want=frozenset({"grad_mask"}))
    with pytest.raises(InvalidInput):
        onnx_engine.run_backward(BackwardTask(no_mask.task, no_mask.grad_output, want=frozenset({"grad_mask"})))


def test_scale_over_temperature_below_float32_is_left_to_numpy(onnx_engine: OnnxEngine) -> None:
    """The float32 graph's ``dQ = (scale / T) dZ K`` would use a factor rounded to 0: the graph declines,
    and auto dispatch answers on numpy (which forms the product in float64).
    """
    rng = np.random.default_rng(3)
    bt = backward_task(rng, SHAPES[0], dtype="float32", scale=1e-25, temperature=1e24)
    assert "underflows float32" in onnx_engine.backward_unsupported_reason(bt)
    assert onnx_engine.backward_unsupported_reason(backward_task(rng, SHAPES[0], dtype="float64", scale=1e-25)) is None
    onnx_first = EngineDispatcher({"numpy": NUMPY, "onnx": onnx_engine}, backward_order=("onnx", "numpy"))
    engine, choice = onnx_first.select(bt, "auto")
    assert engine is NUMPY and "underflows float32" in choice.reason
    with pytest.raises(EngineUnavailable, match="underflows float32"):
        onnx_first.select(bt, "onnx")


def test_auto_picks_numpy_first_and_onnx_when_named(onnx_engine: OnnxEngine) -> None:
    rng = np.random.default_rng(1)
    d = EngineDispatcher({"numpy": NUMPY, "onnx": onnx_engine})
    big = backward_task(rng, (2, 8, 4, 32, 32, 16, 16), dtype="float32")
    engine, choice = d.select(big, "auto")
    assert engine is NUMPY
    assert choice.reason == "auto: numpy's chunked backward pass is faster than the ONNX backward graph"
    engine, choice = d.select(big, "onnx")
    assert engine is onnx_engine and choice.reason == "requested: onnx graph softmax_backward_f32"
    # the forward order is unchanged, and a dispatcher told to try ONNX first does for the backward
    assert d.select(big.task, "auto")[0] is onnx_engine
    onnx_first = EngineDispatcher({"numpy": NUMPY, "onnx": onnx_engine}, backward_order=("onnx", "numpy"))
    engine, choice = onnx_first.select(big, "auto")
    assert engine is onnx_engine and choice.reason == "auto: onnx graph softmax_backward_f32 supports this request"
    sparse = backward_task(rng, (2, 8, 4, 32, 32, 16, 16), dtype="float32", normalizer="sparsemax")
    engine, choice = onnx_first.select(sparse, "auto")
    assert engine is NUMPY and "onnx cannot run this request (no ONNX backward graph" in choice.reason
    with pytest.raises(EngineUnavailable, match="no ONNX backward graph"):
        d.select(sparse, "onnx")
    result, choice = onnx_first.run_backward(big, "auto")
    assert choice.name == "onnx"
    assert_backward_parity(result, NUMPY.run_backward(big), TOL["float32"])


def test_engines_without_a_backward_pass_are_skipped() -> None:
    class ForwardOnly:
        name = "forward-only"
        provider = "none"
        ready = True

        def unsupported_reason(self, task):
            return None

        def run(self, task):
            raise AssertionError("not called")

        def describe(self):
            return {}

    rng = np.random.default_rng(2)
    d = EngineDispatcher({"numpy": NUMPY, "onnx": ForwardOnly()}, backward_order=("onnx", "numpy"))
    bt = backward_task(rng, (2, 8, 4, 32, 32, 16, 16), dtype="float64")
    engine, choice = d.select(bt, "auto")
    assert engine is NUMPY and "onnx cannot run this request (it has no backward pass)" in choice.reason
