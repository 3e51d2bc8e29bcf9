"""The /v2 models ``sample`` and ``calibrate``: same answers as /v1, JSON and binary tensors, protocol errors."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.settings import Settings
from tests import golden
from tests.http.test_v2 import assert_error, binary_request, json_input, wait_ready

DTYPES = {"FP32": "<f4", "FP64": "<f8", "INT64": "<i8"}


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with TestClient(create_app(Settings(enable_onnx=False)), raise_server_exceptions=False) as c:
        wait_ready(c)
        yield c


def outputs_of(r) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(JSON header, every output as an array), for JSON and binary responses alike."""
    assert r.status_code == 200, r.text
    n = int(r.headers.get("inference-header-content-length", len(r.content)))
    header = json.loads(r.content[:n])
    arrays, offset = {}, n
    for out in header["outputs"]:
        dtype = np.dtype(DTYPES[out["datatype"]])
        size = out.get("parameters", {}).get("binary_data_size")
        if size is None:
            arrays[out["name"]] = np.array(out["data"], dtype=dtype).reshape(out["shape"])
        else:
            arrays[out["name"]] = np.frombuffer(r.content[offset : offset + size], dtype=dtype).reshape(out["shape"])
            offset += size
    assert offset == len(r.content)
    return header, arrays


def test_metadata(client) -> None:
    sample = client.get("/v2/models/sample").json()
    assert [t["name"] for t in sample["inputs"]] == ["logits", "previous_tokens", "mask"]
    assert [t["name"] for t in sample["outputs"]] == ["tokens", "logprobs", "raw_logprobs", "probabilities"]
    assert sample["outputs"][0]["datatype"] == "INT64" and sample["inputs"][1]["optional"]
    assert {"temperature", "top_k", "top_p", "min_p", "n", "seed", "top_logprobs"} <= set(sample["parameters"])
    calibrate = client.get("/v2/models/calibrate/versions/1").json()
    assert [t["name"] for t in calibrate["inputs"]] == ["logits", "labels"]
    assert [t["name"] for t in calibrate["outputs"]] == ["temperature", "nll", "ece", "accuracy"]
    assert client.get("/v2/models/sample/ready").json() == {"name": "sample", "ready": True}


def test_sample_json_matches_v1(client) -> None:
    logits = np.random.default_rng(0).standard_normal((3, 50))
    opts = {"temperature": 0.8, "top_k": 20, "top_p": 0.9, "n": 6, "seed": 11, "top_logprobs": 3}
    req = {
        "inputs": [json_input("logits", logits, "FP64")],
        "outputs": [{"name": n} for n in ("tokens", "logprobs", "raw_logprobs", "probabilities")],
        "parameters": opts,
    }
    header, out = outputs_of(client.post("/v2/models/sample/infer", json=req))
    v1 = client.post(
        "/v1/sample",
        json={
            "logits": logits.tolist(),
            **opts,
            "precision": "float64",
            "return": ["tokens", "logprobs", "raw_logprobs", "probabilities", "top_logprobs", "diagnostics"],
        },
    ).json()
    assert out["tokens"].dtype == np.int64 and out["tokens"].tolist() == v1["tokens"]
    np.testing.assert_array_equal(out["logprobs"], v1["logprobs"])
    np.testing.assert_array_equal(out["raw_logprobs"], v1["raw_logprobs"])
    np.testing.assert_array_equal(out["probabilities"], v1["probabilities"])
    params = header["parameters"]
    assert params["seed"] == 11
    assert json.loads(params["top_logprobs"]) == v1["top_logprobs"]
    assert json.loads(params["diagnostics"]) == v1["diagnostics"]
    assert "total" in json.loads(params["timing_ms"])


def test_sample_binary_with_padded_previous_tokens(client) -> None:
    logits = np.random.default_rng(1).standard_normal((2, 20000)).astype(np.float32)  # past max_dim
    previous = np.array([[5, 5, 7], [9, -1, -1]], dtype=np.int64)
    mask = np.ones(20000, dtype=bool)
    mask[:10] = False
    body, headers = binary_request(
        [("logits", logits, "FP32"), ("previous_tokens", previous, "INT64"), ("mask", mask, "BOOL")],
        parameters={
            "binary_data_output": True,
            "frequency_penalty": 0.5,
            "top_p": 0.5,
            "n": 4,
            "seed": 5,
            "diagnostics": False,
        },
        outputs=[{"name": "tokens"}, {"name": "probabilities"}],
    )
    header, out = outputs_of(client.post("/v2/models/sample/infer", content=body, headers=headers))
    assert out["tokens"].shape == (2, 4) and out["probabilities"].dtype == np.float32
    assert "diagnostics" not in header["parameters"]
    v1 = client.post(
        "/v1/sample",
        json={
            "logits": logits.tolist(),
            "previous_tokens": [[5, 5, 7], [9]],
            "mask": mask.tolist(),
            "frequency_penalty": 0.5,
            "top_p": 0.5,
            "n": 4,
            "seed": 5,
            "return": ["tokens", "probabilities"],
        },
    ).json()
    assert out["tokens"].tolist() == v1["tokens"]
    np.testing.assert_array_equal(out["probabilities"], np.array(v1["probabilities"], dtype=np.float32))
    assert np.all(out["probabilities"][:, :10] == 0)


def test_a_single_row_and_a_server_seed(client) -> None:
    req = {"inputs": [json_input("logits", np.array([2.1, 0.5, -1.2, 3.0]), "FP32")], "parameters": {"n": 3}}
    header, out = outputs_of(client.post("/v2/models/sample/infer", json=req))
    assert out["tokens"].shape == (3,) and out["logprobs"].dtype == np.float32
    seed = header["parameters"]["seed"]
    again = {**req, "parameters": {"n": 3, "seed": seed}}
    assert (
        outputs_of(client.post("/v2/models/sample/infer", json=again))[1]["tokens"].tolist() == out["tokens"].tolist()
    )


@pytest.mark.parametrize(
    ("parameters", "fragment"),
    [
        ({"top_p": 0}, "parameter 'top_p'"),
        ({"temperature": -1}, "parameter 'temperature'"),
        ({"top_k": 1.5}, "parameter 'top_k'"),
        ({"n": 0}, "parameter 'n'"),
        ({"top_logprobs": 50}, "parameter 'top_logprobs'"),
        ({"topp": 0.5}, "no parameter 'topp'"),
        ({"diagnostics": "yes"}, "parameter 'diagnostics'"),
    ],
)
def test_sample_bad_parameters_are_400(client, parameters, fragment: str) -> None:
    req = {"inputs": [json_input("logits", np.zeros((2, 4)), "FP32")], "parameters": parameters}
    assert_error(client.post("/v2/models/sample/infer", json=req), 400, fragment)


def test_sample_bad_inputs_are_400(client) -> None:
    logits = json_input("logits", np.zeros((2, 4)), "FP32")
    prev = {"name": "previous_tokens", "shape": [2], "datatype": "INT64", "data": [1, 4]}
    assert_error(client.post("/v2/models/sample/infer", json={"inputs": [logits, prev]}), 400, "previous_tokens[1]")
    rows = {"name": "previous_tokens", "shape": [3, 1], "datatype": "INT64", "data": [1, 2, 3]}
    assert_error(client.post("/v2/models/sample/infer", json={"inputs": [logits, rows]}), 400, "3 rows")
    cube = json_input("logits", np.zeros((2, 2, 2)), "FP32")
    assert_error(client.post("/v2/models/sample/infer", json={"inputs": [cube]}), 400, "rank 3")
    floats = {"name": "previous_tokens", "shape": [1], "datatype": "FP32", "data": [1.0]}
    assert_error(client.post("/v2/models/sample/infer", json={"inputs": [logits, floats]}), 400, "INT64")


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_calibrate_golden(client, binary: bool) -> None:
    case = golden.load("calibrate")[0]
    logits = np.array(case["request"]["logits"])
    labels = np.array(case["request"]["labels"], dtype=np.int64)
    if binary:
        body, headers = binary_request(
            [("logits", logits, "FP64"), ("labels", labels, "INT64")], parameters={"binary_data_output": True}
        )
        r = client.post("/v2/models/calibrate/infer", content=body, headers=headers)
    else:
        inputs = [json_input("logits", logits, "FP64"), json_input("labels", labels, "INT64")]
        r = client.post("/v2/models/calibrate/infer", json={"inputs": inputs, "parameters": {"bins": 15}})
    header, out = outputs_of(r)
    assert out["temperature"][0] == pytest.approx(case["temperature"], rel=1e-6)
    np.testing.assert_allclose(out["nll"], [case["nll"]["before"], case["nll"]["after"]], atol=1e-9)
    np.testing.assert_allclose(out["ece"], [case["ece"]["before"], case["ece"]["after"]], atol=1e-7)
    assert out["accuracy"][0] == pytest.approx(case["accuracy"])
    params = header["parameters"]
    assert params["bounded"] is False
    bins = json.loads(params["reliability"])
    assert len(bins["before"]) == 15 and sum(b["count"] for b in bins["after"]) == len(labels)


def test_calibrate_bad_requests_are_400(client) -> None:
    logits = json_input("logits", np.zeros((2, 3)), "FP32")
    labels = {"name": "labels", "shape": [2], "datatype": "INT64", "data": [0, 3]}
    assert_error(client.post("/v2/models/calibrate/infer", json={"inputs": [logits, labels]}), 400, "labels[1]")
    short = {"name": "labels", "shape": [1], "datatype": "INT64", "data": [0]}
    assert_error(client.post("/v2/models/calibrate/infer", json={"inputs": [logits, short]}), 400, "labels")
    ok = {"name": "labels", "shape": [2], "datatype": "INT64", "data": [0, 1]}
    req = {"inputs": [logits, ok], "parameters": {"method": "platt"}}
    assert_error(client.post("/v2/models/calibrate/infer", json=req), 400, "parameter 'method'")
    assert_error(client.post("/v2/models/calibrate/infer", json={"inputs": [logits]}), 400, "labels")
