"""The per-head inspection over /v1 and /v2 on both engines: the same numbers as the core computes from the
weights, the norm-based weights as a tensor, and every misuse refused naming the field.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.core.diagnostics.inspection import norm_weights, pattern_scores, sink_mass, spectral_norms
from service.settings import Settings

RNG = np.random.default_rng(31)
Q = RNG.standard_normal((2, 4, 6, 8))
K = RNG.standard_normal((2, 2, 6, 8))
V = RNG.standard_normal((2, 2, 6, 5))
TOKENS = [[1, 2, 3, 1, 2, 3], [5, 5, 6, 5, 5, 6]]


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with TestClient(create_app(Settings(enable_onnx=True, grpc_enabled=False))) as c:
        deadline = time.monotonic() + 60
        while c.get("/readyz").json().get("engines", {}).get("onnx") is not True and time.monotonic() < deadline:
            time.sleep(0.05)
        yield c


def body(**extra: Any) -> dict[str, Any]:
    return {"query": Q.tolist(), "key": K.tolist(), "value": V.tolist(), "precision": "float64", **extra}


@pytest.mark.parametrize("engine", ["numpy", "onnx"])
@pytest.mark.parametrize("causal", [False, True])
def test_v1_inspection_is_the_cores_over_the_answered_weights(client: TestClient, engine: str, causal: bool) -> None:
    r = client.post(
        "/v1/attention",
        json=body(
            engine=engine,
            causal=causal,
            key_lengths=[6, 4],
            token_ids=TOKENS,
            exclude_bos=True,
            sink_positions=2,
            scale=0.3,
            temperature=1.5,
            **{"return": ["weights", "inspection", "norm_weights"]},
        ),
    )
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["engine"]["name"] == engine
    weights = np.array(answer["weights"])
    heads = answer["inspection"]["heads"]
    assert answer["inspection"]["sink_positions"] == 2 and len(heads) == 8
    valid = (weights > 0).sum(-1) if causal else np.broadcast_to(np.array([6, 4])[:, None, None], (2, 4, 6))
    sinks = sink_mass(weights, valid, 2)
    spectral = spectral_norms(Q, K, 0.3 / 1.5, np.array([6, 4]))
    patterns = pattern_scores(weights, np.array(TOKENS), exclude_bos=True)
    for entry in heads:
        b, h = entry["batch"], entry["head"]
        assert entry["sink_mass"] == pytest.approx(sinks[b, h], abs=1e-9)
        assert entry["spectral_norm"] == pytest.approx(spectral[b, h], rel=1e-12)
        for name, score in patterns.items():
            assert entry[name] == pytest.approx(score[b, h], abs=1e-9)
    np.testing.assert_allclose(np.array(answer["norm_weights"]), norm_weights(weights, V), rtol=1e-12)


def test_v2_answers_the_same_inspection(client: TestClient) -> None:
    v1 = client.post("/v1/attention", json=body(token_ids=TOKENS, **{"return": ["inspection", "norm_weights"]}))
    inputs = [
        {"name": n, "shape": list(a.shape), "datatype": "FP64", "data": a.ravel().tolist()}
        for n, a in (("query", Q), ("key", K), ("value", V))
    ]
    inputs.append({"name": "token_ids", "shape": [2, 6], "datatype": "INT32", "data": sum(TOKENS, [])})
    v2 = client.post(
        "/v2/models/attention/infer",
        json={"inputs": inputs, "parameters": {"inspection": True}, "outputs": [{"name": "norm_weights"}]},
    )
    assert v2.status_code == 200, v2.text
    assert json.loads(v2.json()["parameters"]["inspection"]) == v1.json()["inspection"]
    tensor = v2.json()["outputs"][0]
    np.testing.assert_array_equal(
        np.array(tensor["data"]).reshape(tensor["shape"]), np.array(v1.json()["norm_weights"])
    )


@pytest.mark.parametrize(
    ("extra", "field", "words"),
    [
        ({"token_ids": [[1, 2, 3], [1, 2, 3]], "return": ["inspection"]}, "token_ids", "[B, S] = [2, 6]"),
        ({"token_ids": TOKENS}, "token_ids", "add 'inspection'"),
        ({"token_ids": [[1, 2, 3, 4, 5, 6], [1, 2]], "return": ["inspection"]}, "token_ids", "rectangular"),
        ({"sink_positions": -1, "return": ["inspection"]}, "sink_positions", "greater than or equal to 0"),
    ],
)
def test_v1_refusals_name_the_field(client: TestClient, extra: dict[str, Any], field: str, words: str) -> None:
    r = client.post("/v1/attention", json=body(**extra))
    assert r.status_code == 422, r.text
    assert field in r.text and words in r.text


def test_pattern_scores_need_a_square_pattern(client: TestClient) -> None:
    r = client.post(
        "/v1/attention",
        json={"query": Q[:, :, :3].tolist(), "key": K.tolist(), "value": V.tolist(), "token_ids": TOKENS,
              "return": ["inspection"]},
    )  # fmt: skip
    assert r.status_code == 422 and "L == S" in r.json()["detail"]


def test_backward_takes_no_token_ids(client: TestClient) -> None:
    """The inspection reads token_ids on the forward pass only: the backward pass refuses them, never ignores."""
    r = client.post("/v1/attention/backward", json=body(grad_output=np.ones((2, 4, 6, 5)).tolist(), token_ids=TOKENS))
    assert r.status_code == 422 and "token_ids" in r.text
    inputs = [
        {"name": n, "shape": list(a.shape), "datatype": "FP64", "data": a.ravel().tolist()}
        for n, a in (("query", Q), ("key", K), ("value", V), ("grad_output", np.ones((2, 4, 6, 5))))
    ]
    inputs.append({"name": "token_ids", "shape": [2, 6], "datatype": "INT64", "data": sum(TOKENS, [])})
    r = client.post("/v2/models/attention_backward/infer", json={"inputs": inputs})
    assert r.status_code == 400 and "no input 'token_ids'" in r.json()["error"]
