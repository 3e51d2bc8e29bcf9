"""Head importance on the backward pass (Michel et al. 2019): ``|sum of grad_output * output|`` per (batch, head).

Checked against PyTorch's autograd through an identity that needs no forward output: for a head with its own keys
and values, ``sum_{l,d} dO[l,d] O[l,d] = sum_{l,d} dO[l,d] sum_j A[l,j] V[j,d] = sum_{j,d} (A^T dO)[j,d] V[j,d]``,
and ``A^T dO`` is the golden cases' ``grad_value`` (computed by autograd, tests/golden/). So the importance of each
head is ``|sum(grad_value * value)|`` over that head, from numbers this service did not compute.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.settings import Settings
from tests import golden

CASES = [
    c
    for c in golden.load("backward")
    if np.asarray(c["request"]["query"]).ndim == 2
    or np.asarray(c["request"]["query"]).shape[-3] == np.asarray(c["request"]["key"]).shape[-3]
]


def as4(a: Any) -> np.ndarray:
    arr = np.asarray(a, dtype=np.float64)
    return arr.reshape((1,) * (4 - arr.ndim) + arr.shape)


@pytest.fixture(scope="module")
def both_engines() -> Iterator[TestClient]:
    with TestClient(create_app(Settings(enable_onnx=True, grpc_enabled=False))) as c:
        deadline = time.monotonic() + 60
        while c.get("/readyz").json().get("engines", {}).get("onnx") is not True and time.monotonic() < deadline:
            time.sleep(0.05)
        yield c


@pytest.mark.parametrize("engine", ["numpy", "onnx"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: str(np.asarray(c["request"]["query"]).shape))
def test_head_importance_agrees_with_autograd(both_engines: TestClient, case: dict[str, Any], engine: str) -> None:
    request = case["request"]
    if engine == "onnx" and request["normalizer"] != "softmax":
        pytest.skip("the ONNX engine has a backward graph for softmax only")
    body = {**request, "engine": engine, "return": ["head_importance", "grad_query"]}
    r = both_engines.post("/v1/attention/backward", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["engine"]["name"] == engine
    got = np.asarray(r.json()["head_importance"])
    want = np.abs((as4(case["expected"]["grad_value"]) * as4(request["value"])).sum(axis=(2, 3)))
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)
    assert "output" not in r.json()  # computed for the importance, returned only when asked


def test_both_engines_run(both_engines: TestClient) -> None:
    assert both_engines.get("/readyz").json()["engines"] == {"numpy": True, "onnx": True}


def test_head_importance_on_v2_is_the_same_tensor(client: TestClient) -> None:
    rng = np.random.default_rng(3)
    arrays = {n: rng.standard_normal((2, 4, 3, 8)) for n in ("query", "key", "value", "grad_output")}
    arrays["key"], arrays["value"] = arrays["key"][:, :2], arrays["value"][:, :2]  # GQA: 4 query heads on 2
    v1 = client.post(
        "/v1/attention/backward",
        json={**{n: a.tolist() for n, a in arrays.items()}, "precision": "float64", "return": ["head_importance"]},
    ).json()["head_importance"]
    inputs = [
        {"name": n, "shape": list(a.shape), "datatype": "FP64", "data": a.ravel().tolist()} for n, a in arrays.items()
    ]
    v2 = client.post(
        "/v2/models/attention_backward/infer", json={"inputs": inputs, "outputs": [{"name": "head_importance"}]}
    ).json()["outputs"][0]
    assert v2["shape"] == [2, 4] and v2["datatype"] == "FP64"
    np.testing.assert_array_equal(np.array(v2["data"]).reshape(2, 4), np.array(v1))
