"""The /v2 Open Inference Protocol API in-process: metadata, health, framing, errors and compression."""

from __future__ import annotations

import gzip
import json
import time
import zlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.app import create_app
from service.engines.numpy_engine import NumpyEngine
from service.settings import Settings

CAP = 1 << 20  # max_body_bytes of the app under test


def wait_ready(c: TestClient) -> None:
    deadline = time.monotonic() + 10
    while c.get("/v2/health/ready").status_code != 200:
        assert time.monotonic() < deadline, "the app never became ready"
        time.sleep(0.01)


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    app = create_app(Settings(enable_onnx=False, max_body_bytes=CAP, gzip_min_bytes=4096, max_work_flops=1e9))
    with TestClient(app, raise_server_exceptions=False) as c:
        wait_ready(c)
        yield c


def assert_error(r, status: int, *fragments: str) -> str:
    """The protocol's error object, with this status and message fragments."""
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"
    body = r.json()
    assert set(body) == {"error"} and isinstance(body["error"], str), body
    for fragment in fragments:
        assert fragment in body["error"], body["error"]
    return body["error"]


def rand(shape, dtype=np.float32, seed=0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def json_input(name: str, arr: np.ndarray, datatype: str = "FP32", nested: bool = False) -> dict[str, Any]:
    return {
        "name": name,
        "shape": list(arr.shape),
        "datatype": datatype,
        "data": arr.tolist() if nested else arr.reshape(-1).tolist(),
    }


def binary_request(
    inputs: list[tuple[str, np.ndarray, str]], outputs=None, parameters=None
) -> tuple[bytes, dict[str, str]]:
    """A body framed by the binary tensor data extension, and its headers."""
    obj: dict[str, Any] = {
        "inputs": [
            {"name": n, "shape": list(a.shape), "datatype": d, "parameters": {"binary_data_size": a.nbytes}}
            for n, a, d in inputs
        ]
    }
    if outputs is not None:
        obj["outputs"] = outputs
    if parameters is not None:
        obj["parameters"] = parameters
    header = json.dumps(obj).encode()
    return header + b"".join(a.tobytes() for _, a, _ in inputs), {"Inference-Header-Content-Length": str(len(header))}


def split_response(r) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(JSON part, binary outputs) of a response, as a client reads it."""
    n = int(r.headers["inference-header-content-length"])
    header = json.loads(r.content[:n])
    arrays, offset = {}, n
    for out in header["outputs"]:
        size = out.get("parameters", {}).get("binary_data_size")
        if size is not None:
            dtype = {"FP32": "<f4", "FP64": "<f8"}[out["datatype"]]
            arrays[out["name"]] = np.frombuffer(r.content[offset : offset + size], dtype=dtype).reshape(out["shape"])
            offset += size
    assert offset == len(r.content)
    return header, arrays


QKV = ("query", "key", "value")


def qkv_inputs(shape=(1, 2, 3, 4), dtype=np.float32, datatype="FP32") -> list[tuple[str, np.ndarray, str]]:
    return [(n, rand(shape, dtype, seed=i), datatype) for i, n in enumerate(QKV)]


def reference(inputs, **params):
    from service.core.types import AttentionInputs, AttentionParams, AttentionTask

    arrays = {n: a for n, a, _ in inputs}
    dtype = arrays["query"].dtype
    task = AttentionTask(
        AttentionInputs(arrays["query"], arrays["key"], arrays["value"]), AttentionParams(**params), np.dtype(dtype)
    )
    return NumpyEngine().run(task)


# ---------------------------------------------------------------- metadata and health


def test_server_metadata_and_health(client) -> None:
    meta = client.get("/v2").json()
    assert meta["name"] == "attention-service" and "binary_tensor_data" in meta["extensions"] and meta["version"]
    assert client.get("/v2/health/live").json() == {"live": True}
    assert client.get("/v2/health/ready").json() == {"ready": True}
    assert client.get("/v2/models/attention/ready").json() == {"name": "attention", "ready": True}
    assert client.get("/v2/models/softmax/versions/1/ready").json() == {"name": "softmax", "ready": True}


@pytest.mark.parametrize("path", ["/v2/models/attention", "/v2/models/attention/versions/1"])
def test_model_metadata(client, path: str) -> None:
    meta = client.get(path).json()
    assert meta["name"] == "attention" and meta["versions"] == ["1"] and meta["platform"]
    inputs = {t["name"]: t for t in meta["inputs"]}
    assert inputs["query"]["datatype"] == "FP32" and inputs["query"]["datatypes"] == ["FP32", "FP64", "FP16"]
    assert inputs["query"]["shape"] == [-1, -1, -1, -1]
    assert inputs["mask"]["datatypes"] == ["BOOL", "FP32", "FP64", "FP16"] and inputs["mask"]["optional"]
    assert inputs["key_lengths"] == {**inputs["key_lengths"], "datatype": "INT64", "shape": [-1]}
    assert [t["name"] for t in meta["outputs"]] == ["output", "weights", "scores", "norm_weights"]
    assert inputs["token_ids"] == {**inputs["token_ids"], "datatype": "INT64", "shape": [-1, -1], "ranks": [1, 2]}
    assert {"normalizer", "alpha", "causal", "scale", "temperature", "engine"} <= set(meta["parameters"])
    softmax = client.get("/v2/models/softmax").json()
    assert [t["name"] for t in softmax["inputs"]] == ["logits", "mask"]


@pytest.mark.parametrize(
    "path",
    [
        "/v2/models/nope",
        "/v2/models/nope/ready",
        "/v2/models/attention/versions/2",
        "/v2/models/attention/versions/2/ready",
    ],
)
def test_unknown_model_or_version_is_404(client, path: str) -> None:
    assert_error(client.get(path), 404)
    assert_error(client.post(path.removesuffix("/ready") + "/infer", json={"inputs": []}), 404)


def test_not_ready_is_503_with_retry_after() -> None:
    class Starting(NumpyEngine):
        name = "slow"

        @property
        def ready(self) -> bool:
            return False

    app = create_app(Settings(enable_onnx=False), engines={"numpy": NumpyEngine(), "slow": Starting()})
    with TestClient(app, raise_server_exceptions=False) as c:
        assert app.state.runtime.startup_done.wait(10)  # start-up over: "not ready", not "starting"
        for path in ("/v2/health/ready", "/v2/models/attention/ready"):
            r = c.get(path)
            assert r.status_code == 503 and r.json()["ready"] is False and r.headers["retry-after"]
            assert "not ready" in r.json()["error"]
        body, headers = binary_request(qkv_inputs())
        r = c.post("/v2/models/attention/infer", content=body, headers=headers)
        assert_error(r, 503, "not ready")
        assert r.headers["retry-after"]
        assert c.get("/v2/health/live").status_code == 200


# ---------------------------------------------------------------- inference


@pytest.mark.parametrize("nested", [False, True], ids=["flat", "nested"])
def test_json_in_json_out(client, nested: bool) -> None:
    inputs = qkv_inputs((2, 3, 5), np.float64, "FP64")
    req = {"id": "a1", "inputs": [json_input(n, a, d, nested) for n, a, d in inputs], "parameters": {"causal": True}}
    r = client.post("/v2/models/attention/infer", json=req)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/json" and "inference-header-content-length" not in r.headers
    body = r.json()
    assert body["model_name"] == "attention" and body["model_version"] == "1" and body["id"] == "a1"
    want = reference(inputs, causal="top_left")
    outputs = {o["name"]: o for o in body["outputs"]}
    assert list(outputs) == ["output", "weights"]
    assert outputs["output"]["datatype"] == "FP64" and outputs["output"]["shape"] == [2, 3, 5]
    np.testing.assert_allclose(
        np.array(outputs["output"]["data"]).reshape(2, 3, 5), want.output, rtol=1e-12, atol=1e-12
    )
    np.testing.assert_allclose(
        np.array(outputs["weights"]["data"]).reshape(2, 3, 3), want.weights, rtol=1e-12, atol=1e-12
    )
    params = body["parameters"]
    assert params["engine"] == "numpy" and params["engine_provider"] and params["engine_reason"]
    assert json.loads(params["diagnostics"])["heads"] and "total" in json.loads(params["timing_ms"])


def test_binary_in_mixed_out(client) -> None:
    inputs = qkv_inputs((1, 2, 4, 8))
    mask = np.tril(np.ones((4, 4), dtype=bool))
    body, headers = binary_request(
        [*inputs, ("mask", mask, "BOOL")],
        outputs=[{"name": "weights"}, {"name": "output", "parameters": {"binary_data": False}}],
        parameters={"binary_data_output": True, "normalizer": "sparsemax"},
    )
    r = client.post("/v2/models/attention/infer", content=body, headers=headers)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/octet-stream"
    header, arrays = split_response(r)
    assert [o["name"] for o in header["outputs"]] == ["weights", "output"]
    want = reference(inputs, normalizer="sparsemax", causal="top_left")
    np.testing.assert_allclose(arrays["weights"], want.weights, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(
        np.array(header["outputs"][1]["data"]).reshape(1, 2, 4, 8), want.output, rtol=1e-6, atol=1e-6
    )


def test_binary_input_at_an_odd_offset_is_aligned(client) -> None:
    inputs = qkv_inputs((1, 1, 3, 2), np.float64, "FP64")
    body, headers = binary_request(inputs, parameters={"diagnostics": False})
    pad = b" " * (8 - int(headers["Inference-Header-Content-Length"]) % 8 + 3)  # JSON may end in whitespace
    n = int(headers["Inference-Header-Content-Length"])
    body = body[:n] + pad + body[n:]
    r = client.post(
        "/v2/models/attention/infer", content=body, headers={"Inference-Header-Content-Length": str(n + len(pad))}
    )
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(
        np.array(r.json()["outputs"][0]["data"]).reshape(1, 1, 3, 2), reference(inputs).output, rtol=1e-12
    )


def test_scores_and_masked_values(client) -> None:
    inputs = qkv_inputs((1, 1, 2, 2))
    mask = np.array([0.0, -np.inf], dtype=np.float32)  # additive float mask: -inf travels in binary only
    body, headers = binary_request(
        [*inputs, ("mask", mask, "FP32")],
        outputs=[{"name": "scores", "parameters": {"binary_data": True}}, {"name": "weights"}],
    )
    r = client.post("/v2/models/attention/infer", content=body, headers=headers)
    assert r.status_code == 200, r.text
    header, arrays = split_response(r)
    assert np.isneginf(arrays["scores"][..., 1]).all()
    weights = header["outputs"][1]["data"]
    assert weights[1] == 0.0 and weights[3] == 0.0 and weights[0] == 1.0


def test_softmax_model(client) -> None:
    logits = np.array([[1.8, -0.3, 2.5, 0.1]])
    mask = np.array([True, True, True, False])
    req = {
        "inputs": [json_input("logits", logits, "FP64"), json_input("mask", mask, "BOOL")],
        "outputs": [{"name": "probabilities"}, {"name": "log_probabilities"}],
        "parameters": {"temperature": 2.0},
    }
    r = client.post("/v2/models/softmax/infer", json=req)
    assert r.status_code == 200, r.text
    out = {o["name"]: o for o in r.json()["outputs"]}
    p = np.array(out["probabilities"]["data"])
    z = np.array([1.8, -0.3, 2.5]) / 2
    np.testing.assert_allclose(p[:3], np.exp(z) / np.exp(z).sum(), rtol=1e-12)
    assert p[3] == 0.0 and out["log_probabilities"]["data"][3] is None  # -inf is null in JSON
    assert "entropy" in json.loads(r.json()["parameters"]["diagnostics"])


def test_key_lengths(client) -> None:
    inputs = qkv_inputs((2, 1, 3, 4), np.float64, "FP64")
    req = {
        "inputs": [json_input(n, a, d) for n, a, d in inputs] + [json_input("key_lengths", np.array([3, 1]), "INT64")]
    }
    r = client.post("/v2/models/attention/infer", json=req)
    assert r.status_code == 200, r.text
    weights = np.array(r.json()["outputs"][1]["data"]).reshape(2, 1, 3, 3)
    assert (weights[1, ..., 1:] == 0).all() and np.allclose(weights[1, ..., 0], 1)


# ---------------------------------------------------------------- errors


def post(client, body: bytes | dict, headers: dict[str, str] | None = None, model: str = "attention"):
    if isinstance(body, dict):
        return client.post(f"/v2/models/{model}/infer", json=body, headers=headers)
    return client.post(f"/v2/models/{model}/infer", content=body, headers=headers)


def json_request(**changes) -> dict[str, Any]:
    req: dict[str, Any] = {"inputs": [json_input(n, a, d) for n, a, d in qkv_inputs()]}
    req.update(changes)
    return req


@pytest.mark.parametrize(
    "req, fragment",
    [
        ({"inputs": [{"name": "query", "shape": [1, 2], "datatype": "INT32", "data": [1, 2]}]}, "datatype 'INT32'"),
        (
            {"inputs": [{"name": "query", "shape": [2, 2], "datatype": "FP32", "data": [1.0, 2.0, 3.0]}]},
            "3 values but shape [2, 2] needs 4",
        ),
        (
            {"inputs": [{"name": "query", "shape": [2, 2], "datatype": "FP32", "data": [[1.0, 2.0], [3.0]]}]},
            "not a rectangular",
        ),
        ({"inputs": [{"name": "query", "shape": [1, 2], "datatype": "FP32", "data": ["a", "b"]}]}, "must be numbers"),
        ({"inputs": [{"name": "query", "shape": [1, 2], "datatype": "FP32"}]}, "neither data nor"),
        ({"inputs": [{"name": "query", "shape": [2, "x"], "datatype": "FP32", "data": [1.0, 2.0]}]}, "shape must be"),
        ({"inputs": [{"name": "query", "shape": [1, 1, 1, 1, 1], "datatype": "FP32", "data": [1.0]}]}, "rank 5"),
        ({"inputs": [{"name": "mask", "shape": [1], "datatype": "BOOL", "data": [1]}]}, "true/false"),
        ({"inputs": [{"name": "key_lengths", "shape": [1], "datatype": "INT64", "data": [1.5]}]}, "integers"),
        ({"inputs": [{"name": "bias", "shape": [1], "datatype": "FP32", "data": [1.0]}]}, "no input 'bias'"),
        ({"inputs": []}, "non-empty list"),
        ({"inputs": {"query": 1}}, "non-empty list"),
        ({"inputs": [7]}, "inputs[0]"),
        (json_request(inputs=json_request()["inputs"][:2]), "needs input 'value'"),
        (json_request(inputs=json_request()["inputs"] + json_request()["inputs"][:1]), "given twice"),
        (json_request(outputs=[{"name": "attn"}]), "no output 'attn'"),
        (json_request(outputs=[{"name": "output"}, {"name": "output"}]), "requested twice"),
        (json_request(outputs=[{"name": "output", "parameters": {"binary_data": "yes"}}]), "binary_data"),
        (json_request(outputs=[{"name": "output", "parameters": {"classification": 3}}]), "classification"),
        (json_request(parameters={"normaliser": "softmax"}), "no parameter 'normaliser'"),
        (json_request(parameters={"normalizer": "softermax"}), "parameter 'normalizer'"),
        (json_request(parameters={"temperature": -1}), "parameter 'temperature'"),
        (json_request(parameters={"alpha": 1.5}), "alpha"),
        (json_request(parameters={"diagnostics": "no"}), "'diagnostics' must be true or false"),
        (json_request(parameters={"binary_data_output": 1}), "binary_data_output"),
        (json_request(parameters={"engine": "onnx"}), "onnx"),
        (json_request(parameters=[1]), "parameters must be an object"),
        (json_request(id=5), "id must be a string"),
    ],
)
def test_invalid_requests_are_400(client, req: dict, fragment: str) -> None:
    assert_error(post(client, req), 400, fragment)


def test_tensor_errors_from_the_core_are_400(client) -> None:
    inputs = [
        json_input(n, rand(s, seed=i))
        for i, (n, s) in enumerate((("query", (1, 2, 4)), ("key", (1, 3, 5)), ("value", (1, 3, 4))))
    ]
    assert_error(post(client, {"inputs": inputs}), 400, "E=")
    inputs = qkv_inputs((1, 1, 2, 2), np.float64, "FP64")
    inputs[0][1][0, 0, 0, 0] = np.nan
    body, headers = binary_request(inputs)
    assert_error(post(client, body, headers), 400, "finite")
    mixed = [inputs[0], *qkv_inputs((1, 1, 2, 2))[1:]]
    body, headers = binary_request(mixed)
    assert_error(post(client, body, headers), 400, "must share one precision (FP64, or FP32 and FP16), got FP32, FP64")


def test_too_much_work_is_413(client) -> None:
    big = [(n, np.zeros((1, 16, 4096, 1), np.float32), "FP32") for n in QKV]  # 768 KiB, ~4e9 flops: over this app's 1e9
    body, headers = binary_request(big)
    assert_error(post(client, body, headers), 413, "estimated work")


@pytest.mark.parametrize(
    "header, fragment",
    [
        ("abc", "must be an integer"),
        ("-5", "must be an integer"),
        ("0", "the body has"),
        ("999999", "the body has"),
        ("3", "not valid JSON"),
    ],
)
def test_bad_inference_header_content_length_is_400(client, header: str, fragment: str) -> None:
    body, _ = binary_request(qkv_inputs())
    assert_error(post(client, body, {"Inference-Header-Content-Length": header}), 400, fragment)


def test_truncated_and_overlong_binary_bodies_are_400(client) -> None:
    body, headers = binary_request(qkv_inputs())
    assert_error(post(client, body[:-1], headers), 400, "truncated")
    assert_error(post(client, body[:-40], headers), 400, "truncated")
    assert_error(post(client, body + b"\0\0\0\0", headers), 400, "4 bytes follow")
    n = int(headers["Inference-Header-Content-Length"])
    assert_error(post(client, body[:n]), 400, "truncated")  # binary inputs announced, no header, no data


def test_binary_size_disagreeing_with_shape_is_400(client) -> None:
    inputs = qkv_inputs()
    obj = {
        "inputs": [
            {"name": n, "shape": list(a.shape), "datatype": d, "parameters": {"binary_data_size": a.nbytes - 4}}
            for n, a, d in inputs
        ]
    }
    header = json.dumps(obj).encode()
    r = post(
        client,
        header + b"".join(a.tobytes() for _, a, _ in inputs),
        {"Inference-Header-Content-Length": str(len(header))},
    )
    assert_error(r, 400, "binary_data_size is 92", "needs 96 bytes")


def test_bad_binary_payloads_are_400(client) -> None:
    inputs = qkv_inputs((1, 1, 2, 2))
    mask = np.array([0, 2], dtype=np.uint8)  # BOOL bytes must be 0 or 1
    body, headers = binary_request([*inputs, ("mask", mask, "BOOL")])
    assert_error(post(client, body, headers), 400, "0 or 1")
    obj = {
        "inputs": [
            {"name": "query", "shape": [1, 1], "datatype": "FP32", "data": [1.0], "parameters": {"binary_data_size": 4}}
        ]
    }
    header = json.dumps(obj).encode()
    assert_error(
        post(client, header + b"\0" * 4, {"Inference-Header-Content-Length": str(len(header))}), 400, "both data and"
    )
    obj["inputs"][0] = {
        "name": "query",
        "shape": [1, 1],
        "datatype": "FP32",
        "parameters": {"shared_memory_region": "r"},
    }
    assert_error(post(client, obj), 400, "shared memory")


@pytest.mark.parametrize("body", [b"", b"{", b"[1, 2]", b"\xff\xfe", b"null"])
def test_malformed_json_is_400(client, body: bytes) -> None:
    assert_error(post(client, body), 400)


def test_softmax_errors(client) -> None:
    logits = [json_input("logits", np.array([1.0, 2.0]), "FP64")]
    assert_error(post(client, {"inputs": logits, "parameters": {"axis": 3}}, model="softmax"), 400, "axis")
    assert_error(
        post(client, {"inputs": logits, "parameters": {"normalizer": "sparsemax", "log": True}}, model="softmax"),
        400,
        "log",
    )
    req = {"inputs": logits, "parameters": {"log": False}, "outputs": [{"name": "log_probabilities"}]}
    assert_error(post(client, req, model="softmax"), 400, "log")


# ---------------------------------------------------------------- compression


@pytest.mark.parametrize("encoding, compress", [("gzip", gzip.compress), ("deflate", zlib.compress)])
@pytest.mark.parametrize("path", ["/v2/models/attention/infer", "/v1/attention"])
def test_compressed_request_bodies(client, path: str, encoding: str, compress) -> None:
    if path.startswith("/v2"):
        body, headers = binary_request(qkv_inputs())
    else:
        body, headers = (
            json.dumps({n: a.tolist() for n, a, _ in qkv_inputs()}).encode(),
            {"Content-Type": "application/json"},
        )
    r = client.post(path, content=compress(body), headers={**headers, "Content-Encoding": encoding})
    assert r.status_code == 200, r.text


def test_gzip_bomb_is_413_and_bad_encodings_are_refused(client) -> None:
    bomb = gzip.compress(b"\0" * (40 << 20), compresslevel=1)  # over this app's cap, and over the default 32 MiB
    assert_error(
        client.post("/v2/models/attention/infer", content=bomb, headers={"Content-Encoding": "gzip"}), 413, "inflates"
    )
    r = client.post("/v1/attention", content=bomb, headers={"Content-Encoding": "gzip"})
    assert r.status_code == 413 and r.headers["content-type"].startswith("application/problem+json")
    assert_error(
        client.post("/v2/models/attention/infer", content=b"{}", headers={"Content-Encoding": "br"}), 415, "br"
    )
    assert_error(
        client.post(
            "/v2/models/attention/infer", content=gzip.compress(b"{}" * 100)[:-9], headers={"Content-Encoding": "gzip"}
        ),
        400,
        "truncated",
    )
    assert_error(
        client.post("/v2/models/attention/infer", content=b"not gzip", headers={"Content-Encoding": "gzip"}),
        400,
        "not valid gzip",
    )


def test_large_responses_are_gzipped_when_accepted(client) -> None:
    body, headers = binary_request(qkv_inputs((1, 4, 32, 16)), parameters={"binary_data_output": True})
    plain = post(client, body, {**headers, "Accept-Encoding": "identity"})
    zipped = post(client, body, {**headers, "Accept-Encoding": "gzip"})
    assert "content-encoding" not in plain.headers
    assert zipped.headers["content-encoding"] == "gzip"
    assert int(zipped.headers["content-length"]) < len(zipped.content)  # httpx has inflated the body
    # Inference-Header-Content-Length counts the JSON of the uncompressed body, as Triton does.
    header, arrays = split_response(zipped)
    _, plain_arrays = split_response(plain)
    np.testing.assert_array_equal(arrays["weights"], plain_arrays["weights"])
    small = post(client, json_request(parameters={"diagnostics": False}), {"Accept-Encoding": "gzip"})
    assert small.status_code == 200 and "content-encoding" not in small.headers


# ---------------------------------------------------------------- fuzzing: never a 5xx

_scalars = st.none() | st.booleans() | st.integers(-(2**65), 2**65) | st.floats(allow_nan=False) | st.text(max_size=4)
_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=12,
)
_datatypes = st.sampled_from(["FP32", "FP64", "BOOL", "INT64", "INT32", "BYTES", "fp32"]) | _values
_shapes = st.lists(st.integers(-1, 4), max_size=5) | _values
_inputs = st.fixed_dictionaries(
    {"name": st.sampled_from(["query", "key", "value", "mask", "key_lengths", "logits", "x"]) | _values},
    optional={
        "shape": _shapes,
        "datatype": _datatypes,
        "data": st.lists(st.floats(-10, 10) | st.booleans(), max_size=20) | _values,
        "parameters": st.fixed_dictionaries({}, optional={"binary_data_size": st.integers(-4, 96) | _values}) | _values,
    },
)
_requests = st.fixed_dictionaries(
    {"inputs": st.lists(_inputs, max_size=5) | _values},
    optional={
        "outputs": st.lists(
            st.fixed_dictionaries({"name": st.sampled_from(["output", "weights", "scores", "x"])}), max_size=3
        )
        | _values,
        "parameters": st.dictionaries(
            st.sampled_from(["normalizer", "causal", "binary_data_output", "engine", "x"]), _values
        ),
        "id": _values,
    },
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    request=_requests,
    tail=st.binary(max_size=100),
    header=st.none() | st.integers(-2, 2000).map(str) | st.text(alphabet=" 0123456789+-xe.", max_size=5),
    model=st.sampled_from(["attention", "softmax"]),
)
def test_no_request_gives_a_server_error(client, request, tail: bytes, header, model: str) -> None:
    head = json.dumps(request).encode()
    headers = {} if header is None else {"Inference-Header-Content-Length": header}
    r = post(client, head + tail if header is not None else head, headers, model=model)
    assert r.status_code in (200, 400, 413), r.text
    if r.status_code != 200:
        assert set(r.json()) == {"error"}


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    dims=st.tuples(st.integers(1, 3), st.integers(1, 3), st.integers(1, 3)),
    size_deltas=st.lists(st.integers(-8, 8), min_size=3, max_size=3),
    tail_delta=st.integers(-12, 12),
    header_delta=st.integers(-3, 3),
    payload=st.binary(min_size=0, max_size=400),
    datatype=st.sampled_from(["FP32", "FP64"]),
)
def test_mangled_binary_framing_is_400_never_5xx(
    client, dims, size_deltas, tail_delta, header_delta, payload, datatype
) -> None:
    L, S, E = dims
    itemsize = 4 if datatype == "FP32" else 8
    shapes = {"query": [1, L, E], "key": [1, S, E], "value": [1, S, E]}
    sizes = {n: max(int(np.prod(s)) * itemsize + d, 0) for (n, s), d in zip(shapes.items(), size_deltas, strict=True)}
    obj = {
        "inputs": [
            {"name": n, "shape": s, "datatype": datatype, "parameters": {"binary_data_size": sizes[n]}}
            for n, s in shapes.items()
        ],
        "parameters": {"binary_data_output": True},
    }
    header = json.dumps(obj).encode()
    need = sum(sizes.values())
    data = (
        (payload * (need // max(len(payload), 1) + 2))[: max(need + tail_delta, 0)]
        if payload
        else bytes(max(need + tail_delta, 0))
    )
    r = post(client, header + data, {"Inference-Header-Content-Length": str(len(header) + header_delta)})
    exact = all(d == 0 for d in size_deltas) and tail_delta == 0 and header_delta == 0
    assert r.status_code in ((200, 400) if exact else (400,)), r.text
    if r.status_code == 200:
        _, arrays = split_response(r)
        assert all(np.isfinite(a).all() for a in arrays.values())
    else:
        assert set(r.json()) == {"error"}


def test_refusals_outside_the_routes_use_the_protocol_error_too(client) -> None:
    assert_error(post(client, b"{" + b" " * (CAP + 10) + b"}"), 413, "larger than the limit")
    assert_error(client.get("/v2/nothing/here"), 404)
    assert_error(client.get("/v2/models/attention/infer"), 405)
