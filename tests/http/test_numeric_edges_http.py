"""Numerical edges through HTTP on both engines and both precisions (issue 13, items 1 to 6).

Where the true answer is representable it is given; where it is not, a 422 that says why. Never a
silent dead row, never an overflowed value written as ``null`` (which means "masked"), and both
engines alike.
"""

from __future__ import annotations

import base64
import math
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.app import create_app
from service.settings import Settings
from tests.http.conftest import assert_problem

ENGINES = ("numpy", "onnx")
PRECISIONS = ("float32", "float64")
THIRDS = [1 / 3, 2 / 3, 0.0]


@pytest.fixture(scope="module")
def both() -> Iterator[TestClient]:
    """An app with both engines; waits until ONNX has loaded its graphs."""
    app = create_app(Settings())
    with TestClient(app, raise_server_exceptions=False) as c:
        deadline = time.monotonic() + 60
        while c.get("/readyz").status_code != 200:
            assert time.monotonic() < deadline, "the app never became ready"
            time.sleep(0.05)
        yield c


def post(c: TestClient, body: dict[str, Any], engine: str, precision: str) -> Any:
    return c.post("/v1/attention", json={**body, "engine": engine, "precision": precision})


def ok(r: Any, engine: str) -> dict[str, Any]:
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["engine"]["name"] == engine
    return body


def tol(precision: str) -> float:
    return 1e-6 if precision == "float32" else 1e-13


def b64(values: list[float], dtype: str = "float32") -> dict[str, Any]:
    arr = np.asarray(values, dtype=dtype)
    return {"shape": list(arr.shape), "dtype": dtype, "b64": base64.b64encode(arr.tobytes()).decode()}


# ------------------------------------------------------------------ 1. relu whose row sum overflows


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("precision,big", [("float32", 3e38), ("float64", 1e308)])
def test_relu_row_sum_overflow_gives_thirds(both, engine, precision, big) -> None:
    body = {
        "query": [[1.0]],
        "key": [[big], [big], [big]],
        "value": [[1, 0], [0, 1], [1, 1]],
        "scale": 1.0,
        "normalizer": "relu",
    }
    res = ok(post(both, body, engine, precision), engine)
    np.testing.assert_allclose(res["weights"], [[1 / 3] * 3], rtol=tol(precision))
    np.testing.assert_allclose(res["output"], [[2 / 3, 2 / 3]], rtol=tol(precision))
    assert res["diagnostics"]["fully_masked_rows"] == 0


# ------------------------------------------------------------------ 2. relu ignores temperature (and scale)

RELU_ROW = {"query": [[1.0]], "key": [[1.0], [2.0], [-1.0]], "value": [[1, 0], [0, 1], [1, 1]], "normalizer": "relu"}


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("option", [{"temperature": 1e300}, {"scale": 1e-46}, {"temperature": 1e-300, "scale": 1e-10}])
def test_relu_is_invariant_to_temperature_and_scale(both, engine, precision, option) -> None:
    res = ok(post(both, {**RELU_ROW, **option, "return": ["output", "weights"]}, engine, precision), engine)
    np.testing.assert_allclose(res["weights"], [THIRDS], rtol=tol(precision), atol=0)
    np.testing.assert_allclose(res["output"], [[1 / 3, 2 / 3]], rtol=tol(precision))


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("precision", PRECISIONS)
def test_relu_scores_that_underflow_are_zero_and_diagnostics_stay_live(both, engine, precision) -> None:
    res = ok(
        post(
            both, {**RELU_ROW, "temperature": 1e300, "return": ["weights", "scores", "diagnostics"]}, engine, precision
        ),
        engine,
    )
    np.testing.assert_allclose(res["weights"], [THIRDS], rtol=tol(precision))
    assert res["diagnostics"]["fully_masked_rows"] == 0
    want = [1e-300, 2e-300, -1e-300] if precision == "float64" else [0.0, 0.0, -0.0]
    np.testing.assert_allclose(res["scores"], [want], rtol=1e-12)


@pytest.mark.parametrize("engine", ENGINES)
def test_relu_scores_that_overflow_are_a_422_not_null(both, engine) -> None:
    body = {**RELU_ROW, "temperature": 1e-40, "return": ["weights", "scores"]}
    assert_problem(post(both, body, engine, "float32"), 422, detail="overflow float32")
    res = ok(post(both, {**body, "return": ["weights"]}, engine, "float32"), engine)  # the weights alone are fine
    np.testing.assert_allclose(res["weights"], [THIRDS], rtol=1e-6)


@pytest.mark.parametrize("precision", PRECISIONS)
def test_softmax_endpoint_relu_is_invariant_to_temperature(both, precision) -> None:
    r = both.post(
        "/v1/softmax",
        json={"logits": [1e-40, 2e-40, 0.0], "normalizer": "relu", "temperature": 1e6, "precision": precision},
    )
    assert r.status_code == 200, r.text
    # float32 holds 1e-40 as a subnormal with ~5 significant digits
    np.testing.assert_allclose(r.json()["probabilities"], THIRDS, rtol=1e-4 if precision == "float32" else 1e-13)
    assert r.json()["diagnostics"]["fully_masked_rows"] == 0


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 2**32 - 1),
    log_t=st.floats(-30, 30),
    engine=st.sampled_from(ENGINES),
)
def test_relu_weights_do_not_change_with_temperature_float64(both, seed, log_t, engine) -> None:
    check_relu_invariance(both, seed, 10.0**log_t, engine, "float64")


F32 = np.finfo(np.float32)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 2**32 - 1),
    # every positive float32 temperature, subnormals included (1.4e-45 to 3.4e38)
    log_t=st.floats(math.log10(float(F32.smallest_subnormal)), math.log10(float(F32.max))),
    engine=st.sampled_from(ENGINES),
)
def test_relu_weights_do_not_change_with_temperature_float32(both, seed, log_t, engine) -> None:
    t = min(10.0**log_t, float(F32.max))
    check_relu_invariance(both, seed, t, engine, "float32")


def check_relu_invariance(c: TestClient, seed: int, temperature: float, engine: str, precision: str) -> None:
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal(s).round(3).tolist() for s in ((2, 2, 4), (2, 5, 4), (2, 5, 3)))
    body = {"query": q, "key": k, "value": v, "normalizer": "relu", "causal": "bottom_right", "return": ["weights"]}
    base = ok(post(c, body, engine, precision), engine)["weights"]
    hot = ok(post(c, {**body, "temperature": temperature}, engine, precision), engine)["weights"]
    np.testing.assert_allclose(hot, base, rtol=tol(precision), atol=0)
    assert np.asarray(base).sum() > 0  # the cases are not trivially all-zero


# ------------------------------------------------------------------ 3. a float mask that overflows after T

MASKED_ROW = {"query": [[1.0]], "key": [[1.0], [2.0], [3.0]], "value": [[1, 0], [0, 1], [1, 1]], "scale": 1.0}


@pytest.mark.parametrize("engine", ENGINES)
def test_float_mask_overflowing_after_temperature_is_a_422_in_float32(both, engine) -> None:
    body = {**MASKED_ROW, "mask": [-1e38, -1e38, -1e38], "temperature": 1e-6}
    assert_problem(post(both, body, engine, "float32"), 422, detail="float mask divided by the temperature overflows")


@pytest.mark.parametrize("engine", ENGINES)
def test_float_mask_after_temperature_in_float64_is_plain_arithmetic(both, engine) -> None:
    # In float64 the bias fits (-1e44), but -1e38 + 3 == -1e38: the bias absorbs the scores, as in any
    # floating-point evaluation of (score + bias) / T, so the row is uniform (docs/concepts/numeric-edges.md).
    body = {**MASKED_ROW, "mask": [-1e38, -1e38, -1e38], "temperature": 1e-6}
    res = ok(post(both, body, engine, "float64"), engine)
    np.testing.assert_allclose(res["weights"], [[1 / 3] * 3], rtol=1e-13)
    # a bias that does not absorb them: a constant bias changes nothing
    res = ok(post(both, {**body, "mask": [-1e10, -1e10, -1e10], "temperature": 1.0}, engine, "float64"), engine)
    e = np.exp([1.0, 2.0, 3.0])
    np.testing.assert_allclose(res["weights"], [e / e.sum()], atol=1e-5)  # -1e10 + 3 keeps 3 to ~2e-6
    res = ok(post(both, {**body, "mask": [-5.0, -5.0, -5.0], "temperature": 1e-6}, engine, "float64"), engine)
    np.testing.assert_allclose(res["weights"], [[0.0, 0.0, 1.0]], atol=1e-300)


# ------------------------------------------------------------------ 4. scores that overflow to -inf

OVERFLOW_CASES = {
    "score plus bias": (
        {"query": [[1.0]], "key": [[-3e38], [-2.9e38]], "value": [[1.0], [2.0]], "mask": [-3e38, -3e38], "scale": 1.0},
        [[0.0, 1.0]],
    ),
    "nothing masked": ({"query": [[1e20]], "key": [[-1e20], [-1e20]], "value": [[1.0], [2.0]]}, [[0.5, 0.5]]),
}


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("case", OVERFLOW_CASES)
@pytest.mark.parametrize("normalizer", ["softmax", "sparsemax", "entmax15", "entmax"])
@pytest.mark.parametrize("returned", [["output"], ["output", "weights"], ["output", "weights", "diagnostics"]])
def test_scores_overflowing_to_minus_inf_are_a_422_in_float32(both, engine, case, normalizer, returned) -> None:
    body, _ = OVERFLOW_CASES[case]
    body = {**body, "normalizer": normalizer, "return": returned, **({"alpha": 1.3} if normalizer == "entmax" else {})}
    assert_problem(post(both, body, engine, "float32"), 422, detail="overflow float32")


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("case", OVERFLOW_CASES)
def test_the_same_scores_are_right_in_float64(both, engine, case) -> None:
    body, weights = OVERFLOW_CASES[case]
    res = ok(post(both, body, engine, "float64"), engine)
    np.testing.assert_allclose(res["weights"], weights, atol=1e-15)
    assert res["diagnostics"]["fully_masked_rows"] == 0


@pytest.mark.parametrize("engine", ENGINES)
def test_one_overflowed_score_in_a_live_row(both, engine) -> None:
    """-6e38 beside 1.0: its weight is 0 either way, but the score itself cannot be written in float32."""
    body = {"query": [[1.0]], "key": [[-3e38], [1.0]], "value": [[1.0], [2.0]], "mask": [-3e38, 0.0], "scale": 1.0}
    res = ok(post(both, {**body, "return": ["output", "weights"]}, engine, "float32"), engine)
    assert res["weights"] == [[0.0, 1.0]] and res["output"] == [[2.0]]
    assert_problem(post(both, {**body, "return": ["scores"]}, engine, "float32"), 422, detail="overflow float32")
    res = ok(post(both, {**body, "return": ["scores"]}, engine, "float64"), engine)
    np.testing.assert_allclose(res["scores"], [[-6e38, 1.0]], rtol=1e-15)


# ------------------------------------------------------------------ 5. a temperature beyond float32's range


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("normalizer", ["softmax", "sparsemax", "relu"])
def test_temperature_1e39_with_an_inf_mask_is_uniform_over_kept_keys(both, engine, precision, normalizer) -> None:
    body = {**MASKED_ROW, "mask": b64([0.0, -math.inf, 0.0], precision), "temperature": 1e39, "normalizer": normalizer}
    res = ok(post(both, body, engine, precision), engine)
    # softmax and sparsemax of scores ~1e-39 apart are uniform; relu ignores T (keys 1 and 3 kept)
    want = [[0.25, 0.0, 0.75]] if normalizer == "relu" else [[0.5, 0.0, 0.5]]
    np.testing.assert_allclose(res["weights"], want, rtol=tol(precision))
    assert res["diagnostics"]["fully_masked_rows"] == 0


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("normalizer", ["softmax", "sparsemax"])
def test_scale_over_temperature_below_float32_with_large_inputs_is_not_uniform(
    both, engine, precision, normalizer
) -> None:
    """A scale / T of 1e-49 is 0 in float32, but a query of 1e25 and keys of 1e24 give scores [3, 1, 2]: the
    float32 answer is float64's, on both engines (it was uniform).
    """
    body = {
        "query": [[1e25]],
        "key": [[3e24], [1e24], [2e24]],
        "value": [[1, 0], [0, 1], [1, 1]],
        "scale": 1e-25,
        "temperature": 1e24,
        "normalizer": normalizer,
    }
    res = ok(post(both, body, engine, precision), engine)
    z = np.array([3.0, 1.0, 2.0])
    want = np.exp(z - 3) / np.exp(z - 3).sum() if normalizer == "softmax" else np.array([1.0, 0.0, 0.0])
    np.testing.assert_allclose(res["weights"], [want], rtol=tol(precision) * 10, atol=1e-7)


# ------------------------------------------------------------------ 6. log-probabilities beyond float32


def test_log_probability_beyond_float32_is_a_422_not_null(both) -> None:
    r = both.post("/v1/softmax", json={"logits": [3e38, -3e38, 1.0], "log": True})
    body = assert_problem(r, 422, loc=["logits", 1], detail="beyond float32")
    assert "precision float64" in body["detail"]
    r = both.post("/v1/softmax", json={"logits": [3e38, -3e38, 1.0]})  # without log: representable
    assert r.status_code == 200 and r.json()["probabilities"] == [1.0, 0.0, 0.0]


def test_log_probability_in_float64_is_exact(both) -> None:
    r = both.post("/v1/softmax", json={"logits": [3e38, -3e38, 1.0], "log": True, "precision": "float64"})
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(r.json()["log_probabilities"], [0.0, -6e38, -3e38], rtol=1e-15)
    assert r.json()["probabilities"] == [1.0, 0.0, 0.0]


def test_masked_log_probabilities_stay_null(both) -> None:
    r = both.post("/v1/softmax", json={"logits": [3e38, 1.0, 2.0], "mask": [True, False, True], "log": True})
    assert r.status_code == 200, r.text
    logp = r.json()["log_probabilities"]
    assert logp[0] == 0.0 and logp[1] is None and logp[2] == pytest.approx(-3e38, rel=1e-6)


def test_v2_softmax_log_overflow_is_a_400(both) -> None:
    infer = {
        "inputs": [{"name": "logits", "shape": [3], "datatype": "FP32", "data": [3e38, -3e38, 1.0]}],
        "outputs": [{"name": "log_probabilities"}],
    }
    r = both.post("/v2/models/softmax/infer", json=infer)
    assert r.status_code == 400 and "beyond float32" in r.json()["error"], r.text


@pytest.mark.parametrize("engine", ENGINES)
def test_v2_attention_overflow_is_a_400_in_fp32_and_right_in_fp64(both, engine) -> None:
    def infer(datatype: str) -> Any:
        inputs = [
            {"name": "query", "shape": [1, 1], "datatype": datatype, "data": [1e20]},
            {"name": "key", "shape": [2, 1], "datatype": datatype, "data": [-1e20, -1e20]},
            {"name": "value", "shape": [2, 1], "datatype": datatype, "data": [1.0, 2.0]},
        ]
        return both.post("/v2/models/attention/infer", json={"inputs": inputs, "parameters": {"engine": engine}})

    r = infer("FP32")
    assert r.status_code == 400 and "overflow float32" in r.json()["error"], r.text
    r = infer("FP64")
    assert r.status_code == 200, r.text
    outputs = {o["name"]: o["data"] for o in r.json()["outputs"]}
    assert outputs["weights"] == [0.5, 0.5] and outputs["output"] == [1.5]
    assert r.json()["parameters"]["engine"] == engine
