"""alpha-entmax near alpha = 1 on the ONNX graphs (issue 21, items 1 and 2).

The float32 graph took alpha in float32, which rounds 1 < alpha < 1 + 2^-24 to 1.0: every weight came out
uniform (1/3 for the issue's request, 1/120 for a 9,600-score request that ``auto`` sends to ONNX). Both
graphs now take alpha in float64, and below alpha - 1 = NEAR_ONE they take the numpy reference's near-one
form, so float64 weights are within 1e-9 of a 60-digit reference there too.
"""

from __future__ import annotations

import numpy as np
import pytest

from service.core.types import AttentionInputs, AttentionParams, AttentionTask
from service.engines.dispatch import EngineDispatcher
from service.engines.numpy_engine import NumpyEngine
from service.engines.onnx_engine import OnnxEngine
from service.export import DEFAULT_MODELS_DIR
from tests.core.entmax_reference import entmax_reference

NUMPY = NumpyEngine()
Q = np.array([[1.0, 2.0]])
K = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
V = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])


@pytest.fixture(scope="module")
def onnx_engine() -> OnnxEngine:
    engine = OnnxEngine(DEFAULT_MODELS_DIR)
    engine.start()
    assert engine.ready, engine.describe()
    return engine


def task(q: np.ndarray, k: np.ndarray, v: np.ndarray, alpha: float, dtype: str, **kw: object) -> AttentionTask:
    params = AttentionParams(normalizer="entmax", alpha=alpha, **kw)  # type: ignore[arg-type]
    return AttentionTask(AttentionInputs(q, k, v), params, np.dtype(dtype), need_weights=True)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_the_issues_request_is_not_uniform(onnx_engine: OnnxEngine, dtype: str) -> None:
    t = task(Q, K, V, 1.00000001, dtype)
    assert onnx_engine.graph_for(t) == f"entmax_{dtype.replace('float', 'f')}"
    got = onnx_engine.run(t)
    want = np.array(entmax_reference((Q @ K.T / np.sqrt(2))[0].tolist(), 1.00000001))
    tol = 1e-6 if dtype == "float32" else 1e-12
    np.testing.assert_allclose(got.weights[0], want, atol=tol, rtol=0)
    np.testing.assert_allclose(got.output[0], want @ V, atol=10 * tol, rtol=0)
    np.testing.assert_allclose(got.weights[0], [0.14003, 0.28400, 0.57598], atol=1e-5)


@pytest.mark.parametrize("am1", [1e-12, 1e-10, 1e-9, 1e-8, 1e-6, 1e-3, 0.01, 0.02, 0.3, 2.0])
def test_float64_weights_match_the_60_digit_reference(onnx_engine: OnnxEngine, am1: float) -> None:
    rng = np.random.default_rng(7)
    q, k = 2 * rng.standard_normal((1, 2, 3, 4)), 2 * rng.standard_normal((1, 2, 6, 4))
    v = rng.standard_normal((1, 2, 6, 3))
    got = onnx_engine.run(task(q, k, v, 1 + am1, "float64", scale=0.5))
    z = 0.5 * q @ k.transpose(0, 1, 3, 2)
    want = np.array([entmax_reference(row, 1 + am1) for row in z.reshape(-1, 6).tolist()]).reshape(z.shape)
    assert np.abs(got.weights - want).max() <= 1e-9
    np.testing.assert_allclose(got.weights, NUMPY.run(task(q, k, v, 1 + am1, "float64", scale=0.5)).weights, atol=1e-12)


def test_auto_sends_a_large_near_one_request_to_onnx_and_gets_the_right_answer(onnx_engine: OnnxEngine) -> None:
    """9,600 scores with alpha = 1 + 1e-9: ``auto`` picks the float32 ONNX graph, which answered 1/120 everywhere."""
    rng = np.random.default_rng(3)
    q, k, v = (
        rng.standard_normal((1, 4, 20, 8)),
        rng.standard_normal((1, 4, 120, 8)),
        rng.standard_normal((1, 4, 120, 4)),
    )
    t = task(q, k, v, 1 + 1e-9, "float32")
    dispatcher = EngineDispatcher({"onnx": onnx_engine, "numpy": NUMPY})
    engine, choice = dispatcher.select(t, "auto")
    assert engine is onnx_engine, choice
    got = engine.run(t)
    want = NUMPY.run(task(q, k, v, 1 + 1e-9, "float64"))
    assert np.ptp(got.weights, axis=-1).min() > 1e-3  # not uniform
    np.testing.assert_allclose(got.weights, want.weights, atol=2e-7, rtol=0)
    np.testing.assert_allclose(got.output, want.output, atol=2e-6, rtol=0)
