"""POST /v1/attention/backward over HTTP: the golden backward cases in every wire form, options, errors, budget."""

from __future__ import annotations

import time

import numpy as np
import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.core.attention import Dims
from service.core.backward import BackwardTask, run_backward
from service.core.types import AttentionInputs, AttentionParams, AttentionTask
from service.dataplane import budget
from service.settings import Settings
from tests.golden import load, tolerance
from tests.http.conftest import assert_problem
from tests.http.test_attention_http import b64, decode, flat

GRADS = ("grad_query", "grad_key", "grad_value")


def as_form(request: dict, form: str) -> dict:
    body = dict(request)
    for name in ("query", "key", "value", "mask", "grad_output", "grad_weights"):
        if name not in body or form == "nested":
            continue
        arr = np.array(body[name])
        dtype = "bool" if arr.dtype == bool else "float64"
        body[name] = flat(arr, dtype) if form == "flat" else b64(arr, dtype)
    return body


@pytest.mark.parametrize("encoding", ["json", "base64"])
@pytest.mark.parametrize("form", ["nested", "flat", "b64"])
@pytest.mark.parametrize("case", load("backward"), ids=lambda c: c["request"]["normalizer"])
def test_golden_backward_over_http(client, case: dict, form: str, encoding: str) -> None:
    body = as_form(case["request"], form) | {"encoding": encoding}
    r = client.post("/v1/attention/backward", json=body)
    assert r.status_code == 200, r.text
    got = r.json()
    assert set(got) == {*GRADS, "engine", "timing_ms"}  # the default return
    tol = tolerance(case["request"])
    for name in GRADS:
        if encoding == "base64":
            assert got[name]["dtype"] == "float64" and "b64" in got[name]
        np.testing.assert_allclose(decode(got[name]), np.array(case["expected"][name]), atol=tol, rtol=0, err_msg=name)
    assert got["engine"]["name"] == "numpy" and got["engine"]["reason"]


def rand_request(seed: int = 0, **extra) -> dict:
    rng = np.random.default_rng(seed)
    body = {
        "query": rng.standard_normal((1, 4, 3, 4)).tolist(),
        "key": rng.standard_normal((1, 2, 5, 4)).tolist(),
        "value": rng.standard_normal((1, 2, 5, 2)).tolist(),
        "grad_output": rng.standard_normal((1, 4, 3, 2)).tolist(),
    }
    body.update(extra)
    return body


def core_backward(body: dict, want: set[str]):
    mask = body.get("mask")
    causal = body.get("causal", False)
    task = AttentionTask(
        AttentionInputs(
            np.array(body["query"]),
            np.array(body["key"]),
            np.array(body["value"]),
            None if mask is None else np.array(mask),
            None if body.get("key_lengths") is None else np.array(body["key_lengths"]),
        ),
        AttentionParams(
            normalizer=body.get("normalizer", "softmax"),
            alpha=body.get("alpha"),
            scale=body.get("scale"),
            temperature=body.get("temperature", 1.0),
            causal="top_left" if causal is True else (causal or None),
        ),
        np.dtype(body.get("precision", "float32")),
    )
    gw = body.get("grad_weights")
    return run_backward(
        BackwardTask(task, np.array(body["grad_output"]), None if gw is None else np.array(gw), frozenset(want))
    )


@pytest.mark.parametrize("normalizer,alpha", [("softmax", None), ("entmax", 1.7), ("relu", None)])
def test_every_return_option(client, normalizer: str, alpha: float | None) -> None:
    rng = np.random.default_rng(1)
    want = {
        "grad_query",
        "grad_key",
        "grad_value",
        "grad_mask",
        "grad_scale",
        "grad_temperature",
        "output",
        "weights",
        "gradient_health",
    }
    body = rand_request(
        mask=rng.standard_normal((1, 1, 3, 5)).tolist(),  # broadcast over heads: its gradient is summed over them
        grad_weights=rng.standard_normal((1, 4, 3, 5)).tolist(),
        causal="bottom_right",
        key_lengths=[4],
        temperature=0.7,
        normalizer=normalizer,
        precision="float64",
        **({"alpha": alpha} if alpha else {}),
    )
    body["return"] = sorted(want)
    r = client.post("/v1/attention/backward", json=body)
    assert r.status_code == 200, r.text
    got = r.json()
    ref = core_backward(body, want)
    for name in ("grad_query", "grad_key", "grad_value", "grad_mask", "output", "weights"):
        np.testing.assert_allclose(np.array(got[name]), getattr(ref, name), atol=1e-12, err_msg=name)
    assert np.array(got["grad_mask"]).shape == (1, 1, 3, 5)
    assert np.array(got["grad_mask"])[..., 4].tolist() == [[[0.0, 0.0, 0.0]]]  # key 4 is beyond key_lengths
    assert got["grad_scale"] == pytest.approx(ref.grad_scale, abs=1e-12)
    assert got["grad_temperature"] == pytest.approx(ref.grad_temperature, abs=1e-12)
    heads = got["gradient_health"]["heads"]
    assert [(h["batch"], h["head"]) for h in heads] == [(0, 0), (0, 1), (0, 2), (0, 3)]
    np.testing.assert_allclose(
        [h["mean_jacobian_norm"] for h in heads], ref.gradient_health.mean_jacobian_norm[0], atol=1e-12
    )
    assert got["gradient_health"]["threshold"] == 1e-3


def test_float32_default_rank_2_and_fully_masked_rows(client) -> None:
    rng = np.random.default_rng(2)
    body = {
        "query": rng.standard_normal((3, 4)).tolist(),
        "key": rng.standard_normal((5, 4)).tolist(),
        "value": rng.standard_normal((5, 2)).tolist(),
        "grad_output": rng.standard_normal((3, 2)).tolist(),
        "mask": [[True] * 5, [False] * 5, [True, False, True, False, True]],
        "encoding": "base64",
    }
    r = client.post("/v1/attention/backward", json=body)
    assert r.status_code == 200, r.text
    got = {k: decode(r.json()[k]) for k in GRADS}
    assert got["grad_query"].dtype == np.float32 and got["grad_query"].shape == (3, 4)
    assert got["grad_key"].shape == (5, 4) and got["grad_value"].shape == (5, 2)
    assert (got["grad_query"][1] == 0).all()  # the fully masked row
    assert all(np.isfinite(g).all() for g in got.values())


def test_gradient_health_on_the_forward_endpoint(client) -> None:
    body = rand_request()
    del body["grad_output"]
    r = client.post("/v1/attention", json=body)
    assert "gradient_health" not in r.json()  # /v1/attention's defaults are unchanged
    sharp = client.post("/v1/attention", json=body | {"return": ["gradient_health"], "scale": 1e3})
    smooth = client.post("/v1/attention", json=body | {"return": ["gradient_health"], "scale": 1e-3})
    assert sharp.status_code == smooth.status_code == 200
    assert set(sharp.json()) == {"gradient_health", "engine", "timing_ms"}
    sharp_heads, smooth_heads = sharp.json()["gradient_health"]["heads"], smooth.json()["gradient_health"]["heads"]
    assert len(sharp_heads) == 4
    # scores scaled by 1000 saturate softmax: the Jacobian vanishes; scaled by 1e-3 the weights are near uniform
    assert all(h["vanishing_fraction"] == 1.0 and h["mean_jacobian_norm"] < 1e-3 for h in sharp_heads)
    # near-uniform over 5 keys: ||diag(p) - pp^T||_F^2 = 5/25 - 2*5/125 + (5/25)^2 = 0.16
    assert all(
        h["vanishing_fraction"] == 0.0 and h["mean_jacobian_norm"] == pytest.approx(0.4, abs=1e-3) for h in smooth_heads
    )
    relu = client.post("/v1/attention", json=body | {"return": ["gradient_health"], "normalizer": "relu"})
    assert relu.status_code == 200 and len(relu.json()["gradient_health"]["heads"]) == 4


@pytest.mark.parametrize(
    "patch,loc",
    [
        ({"grad_output": None}, ["grad_output"]),
        ({"grad_output": np.zeros((1, 4, 3, 3)).tolist()}, ["grad_output"]),
        ({"grad_output": b64(np.full((1, 4, 3, 2), np.nan))}, ["grad_output", 0, 0, 0, 0]),
        ({"grad_weights": np.zeros((1, 4, 3, 4)).tolist()}, ["grad_weights"]),
        ({"return": ["grad_mask"]}, ["return", 0]),
        ({"return": ["grad_query", "grad_mask"], "mask": [[True] * 5] * 3}, ["return", 1]),
        ({"return": ["scores"]}, ["return", 0]),
        ({"temperature": 0}, ["temperature"]),
        ({"engine": "onnx"}, ["engine"]),
        ({"query": np.zeros((1, 4, 3, 5)).tolist()}, ["key", "shape", 3]),
    ],
)
def test_bad_inputs_are_422_naming_the_field(client, patch: dict, loc: list) -> None:
    body = rand_request()
    for k, v in patch.items():
        if v is None:
            body.pop(k)
        else:
            body[k] = v
    assert_problem(client.post("/v1/attention/backward", json=body), 422, loc=loc)


def test_budget_gives_413() -> None:
    dims = Dims(B=1, Hq=4, Hkv=2, L=3, S=5, E=4, Ev=2)  # rand_request's shapes
    forward, _ = budget.attention_estimate(dims, "softmax", {"output", "weights", "diagnostics"}, "float32", "json")
    backward, _ = budget.backward_estimate(dims, "softmax", {"grad_query", "grad_key", "grad_value"}, "float32", "json")
    assert forward < backward
    settings = Settings(enable_onnx=False, max_work_flops=(forward + backward) / 2)
    with TestClient(create_app(settings), raise_server_exceptions=False) as c:
        body = rand_request()
        # the forward of this request fits the budget; its backward (three times the products) does not
        assert c.post("/v1/attention", json={k: v for k, v in body.items() if k != "grad_output"}).status_code == 200
        assert_problem(c.post("/v1/attention/backward", json=body), 413, detail="estimated work")


@pytest.fixture(scope="module")
def onnx_client():
    with TestClient(create_app(Settings(enable_onnx=True)), raise_server_exceptions=False) as c:
        assert c.get("/readyz").status_code in (200, 503)
        for _ in range(600):  # the engines warm up in a thread after start-up
            if c.get("/readyz").status_code == 200:
                break
            time.sleep(0.05)
        yield c


@pytest.mark.parametrize("case", [c for c in load("backward") if c["request"]["normalizer"] == "softmax"])
def test_golden_softmax_backward_on_onnx_over_http(onnx_client, case: dict) -> None:
    body = as_form(case["request"], "b64") | {"engine": "onnx", "encoding": "base64"}
    r = onnx_client.post("/v1/attention/backward", json=body)
    assert r.status_code == 200, r.text
    got = r.json()
    assert got["engine"]["name"] == "onnx" and got["engine"]["reason"] == "requested: onnx graph softmax_backward_f64"
    for name in GRADS:
        np.testing.assert_allclose(decode(got[name]), np.array(case["expected"][name]), atol=1e-8, rtol=0)


def test_onnx_backward_choices_over_http(onnx_client) -> None:
    rng = np.random.default_rng(4)
    big = {
        "query": b64(rng.standard_normal((1, 8, 32, 16)), "float32"),
        "key": b64(rng.standard_normal((1, 8, 32, 16)), "float32"),
        "value": b64(rng.standard_normal((1, 8, 32, 16)), "float32"),
        "grad_output": b64(rng.standard_normal((1, 8, 32, 16)), "float32"),
        "return": ["grad_query", "grad_scale", "gradient_health"],
    }
    auto = onnx_client.post("/v1/attention/backward", json=big)
    assert auto.status_code == 200, auto.text
    assert auto.json()["engine"] == {
        "name": "numpy",
        "provider": "CPU/numpy",
        "reason": "auto: numpy's chunked backward pass is faster than the ONNX backward graph",
    }
    onnx = onnx_client.post("/v1/attention/backward", json=big | {"engine": "onnx"}).json()
    assert onnx["engine"]["reason"] == "requested: onnx graph softmax_backward_f32"
    np.testing.assert_allclose(np.array(onnx["grad_query"]), np.array(auto.json()["grad_query"]), atol=1e-5)
    assert onnx["grad_scale"] == pytest.approx(auto.json()["grad_scale"], rel=1e-4)
    assert len(onnx["gradient_health"]["heads"]) == 8
    assert_problem(
        onnx_client.post("/v1/attention/backward", json=big | {"normalizer": "sparsemax", "engine": "onnx"}),
        422,
        loc=["engine"],
        detail="no ONNX backward graph",
    )


def test_relu_at_a_temperature_that_overflows_float32_scores(client) -> None:
    """The forward leaves the temperature out for relu (its weights do not depend on it); so does the backward."""
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((1, 2, 4, 3)).astype(np.float32).tolist() for _ in range(3))
    body = {"query": q, "key": k, "value": v, "normalizer": "relu", "grad_output": v}
    ret = ["grad_query", "grad_key", "grad_value", "grad_scale", "grad_temperature", "weights"]
    answers = [
        client.post("/v1/attention/backward", json={**body, "temperature": t, "return": ret}) for t in (1.0, 1e-40)
    ]
    assert [a.status_code for a in answers] == [200, 200], answers[1].text
    at_one, tiny = (a.json() for a in answers)
    for name in ("grad_query", "grad_key", "grad_value", "weights", "grad_scale"):
        assert tiny[name] == at_one[name], name
    assert tiny["grad_temperature"] == 0.0
    forward_body = {key: value for key, value in body.items() if key != "grad_output"}
    forward = client.post("/v1/attention", json={**forward_body, "temperature": 1e-40, "return": ["weights"]})
    assert forward.status_code == 200
    np.testing.assert_allclose(np.array(forward.json()["weights"]), np.array(tiny["weights"]), rtol=1e-6)
