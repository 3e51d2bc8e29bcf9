"""Issue 21 over HTTP: no silent wrong answer at the numeric extremes, on both engines where both run.

Each test is one of the issue's requests, answered wrong (or misreported) before the fix.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.settings import Settings
from tests.http.conftest import assert_problem


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


def b64(values: list[float], dtype: str) -> dict[str, Any]:
    arr = np.asarray(values, dtype=dtype)
    return {"shape": list(arr.shape), "dtype": dtype, "b64": base64.b64encode(arr.tobytes()).decode()}


# ------------------------------------------------------------------ 1. alpha-entmax with alpha just above 1

ENTMAX_REQUEST = {
    "query": [[1.0, 2.0]],
    "key": [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]],
    "value": [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]],
    "normalizer": "entmax",
    "alpha": 1.00000001,
    "return": ["weights", "output"],
}


@pytest.mark.parametrize("engine", ["numpy", "onnx"])
@pytest.mark.parametrize("precision", ["float32", "float64"])
def test_entmax_alpha_just_above_one_is_not_uniform(both: TestClient, engine: str, precision: str) -> None:
    r = both.post("/v1/attention", json={**ENTMAX_REQUEST, "engine": engine, "precision": precision})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["engine"]["name"] == engine
    np.testing.assert_allclose(body["weights"], [[0.14003, 0.28400, 0.57598]], atol=1e-5)
    np.testing.assert_allclose(body["output"], [[3.872, 4.872]], atol=1e-3)


def test_auto_with_many_scores_and_alpha_near_one(both: TestClient) -> None:
    """9,600 scores with alpha = 1 + 1e-9: ``auto`` sends them to ONNX, which answered 1/120 for every weight."""
    rng = np.random.default_rng(0)
    q, k = rng.standard_normal((4, 20, 8)), rng.standard_normal((4, 120, 8))
    body = {
        "query": b64(q.tolist(), "float32"),
        "key": b64(k.tolist(), "float32"),
        "value": b64(k.tolist(), "float32"),
        "normalizer": "entmax",
        "alpha": 1 + 1e-9,
        "return": ["weights"],
    }
    auto = both.post("/v1/attention", json=body).json()
    numpy = both.post("/v1/attention", json={**body, "engine": "numpy", "precision": "float64"}).json()
    assert auto["engine"]["name"] == "onnx", auto["engine"]
    w = np.array(auto["weights"])
    assert np.ptp(w, axis=-1).min() > 1e-3
    np.testing.assert_allclose(w, numpy["weights"], atol=2e-6)


# ------------------------------------------------------------------ 3. /v1/sample scales as /v1/softmax does


@pytest.mark.parametrize(
    ("logits", "temperature", "precision", "want"),
    [
        ([-1e38, 3e38, 0.0], 1e38, "float32", [0.0171, 0.9362, 0.0466]),
        ([2e38, 1e38, 0.0], 1e39, "float32", [0.3672, 0.3322, 0.3006]),
        ([-1.7e308, 1.7e308], 1.5e308, "float64", [0.0939, 0.9061]),
    ],
)
def test_sample_draws_from_the_distribution_softmax_gives(
    both: TestClient, logits: list[float], temperature: float, precision: str, want: list[float]
) -> None:
    common = {"logits": b64(logits, precision), "temperature": temperature, "precision": precision}
    r = both.post("/v1/sample", json={**common, "seed": 1, "return": ["probabilities"]})
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(r.json()["probabilities"], want, atol=1e-4)
    soft = both.post("/v1/softmax", json=common)
    assert soft.status_code == 200, soft.text
    np.testing.assert_allclose(r.json()["probabilities"], soft.json()["probabilities"], rtol=1e-6, atol=0)


# ------------------------------------------------------------------ 4. analyze refuses what /v1/attention refuses


@pytest.mark.parametrize(
    ("query", "key"),
    [([[1e200, 0.0], [1.0, 0.0]], [[1e200, 0.0], [0.0, 1.0]]), ([[1e160, 0.0]], [[1e160, 0.0], [-1e160, 1.0]])],
)
def test_analyze_refuses_scores_that_overflow(both: TestClient, query: list, key: list) -> None:
    body = {"query": query, "key": key, "scales": [1.0], "temperatures": [1.0]}
    p = assert_problem(both.post("/v1/attention/analyze", json=body), 422, detail="the scores overflow float64")
    assert "sweep point scale = 1, temperature = 1" in p["detail"]
    attention = {"query": query, "key": key, "value": key, "scale": 1.0, "precision": "float64"}
    assert_problem(both.post("/v1/attention", json=attention), 422, detail="overflow float64")


def test_analyze_reports_a_representable_std(both: TestClient) -> None:
    body = {"query": [[1.0, 2.0], [3.0, -1.0]], "key": [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], "temperatures": [1.0]}
    r = both.post("/v1/attention/analyze", json={**body, "scales": [1e300]})
    assert r.status_code == 200, r.text
    (row,) = r.json()["sweep"]
    assert row["score_std"] == pytest.approx(1.3743685418725535e300, rel=1e-12)


# ------------------------------------------------------------------ 5. messages that name the right thing


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"repetition_penalty": 1e300, "previous_tokens": [0, 1]}, "repetition_penalty"),
        ({"frequency_penalty": 1e308, "previous_tokens": [0, 0, 1, 1], "precision": "float64"}, "frequency_penalty"),
    ],
)
def test_a_penalty_overflow_is_not_blamed_on_a_mask(both: TestClient, extra: dict, field: str) -> None:
    r = both.post("/v1/sample", json={"logits": [-2.0, -3.0], "seed": 1, **extra})
    p = assert_problem(r, 422, loc=[field])
    assert "mask" not in p["detail"] and "previous_tokens" in p["detail"]


def test_a_float64_log_probability_overflow_says_what_helps(both: TestClient) -> None:
    body = {"logits": b64([1.7e308, -1.7e308, 1.0], "float64"), "precision": "float64", "log": True}
    p = assert_problem(both.post("/v1/softmax", json=body), 422, loc=["logits", 1])
    assert "precision float64" not in p["detail"] and "leave out log" in p["detail"]
