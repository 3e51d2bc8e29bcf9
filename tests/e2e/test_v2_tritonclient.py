"""The /v2 API with the real Triton HTTP client against a live uvicorn server.

Every combination of JSON and binary inputs and outputs, for a tiny and a
realistic shape, is compared with the numpy engine run in-process.
"""

from __future__ import annotations

import gzip
import json

import httpx
import numpy as np
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from service.core.types import AttentionInputs, AttentionParams, AttentionTask
from service.engines.numpy_engine import NumpyEngine

pytestmark = pytest.mark.slow

SHAPES = [(1, 1, 4, 4), (1, 8, 128, 64)]


@pytest.fixture(scope="module")
def client(live_server):
    c = triton.InferenceServerClient(live_server.authority, connection_timeout=10.0, network_timeout=30.0)
    yield c
    c.close()


def expected(q, k, v, *, mask=None, key_lengths=None, dtype=np.float32, **params):
    task = AttentionTask(
        inputs=AttentionInputs(query=q, key=k, value=v, mask=mask, key_lengths=key_lengths),
        params=AttentionParams(**params),
        dtype=np.dtype(dtype),
        need_weights=True,
        need_scores=True,
    )
    return NumpyEngine().run(task)


def tensor(name: str, arr: np.ndarray, datatype: str, binary: bool) -> triton.InferInput:
    t = triton.InferInput(name, list(arr.shape), datatype)
    t.set_data_from_numpy(arr, binary_data=binary)
    return t


def qkv(shape, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(dtype) for _ in range(3)]


def test_health_and_metadata(client) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready("attention") and client.is_model_ready("softmax")
    assert not client.is_model_ready("nope")
    meta = client.get_server_metadata()
    assert "binary_tensor_data" in meta["extensions"]
    model = client.get_model_metadata("attention")
    assert [i["name"] for i in model["inputs"]] == ["query", "key", "value", "mask", "key_lengths", "token_ids"]
    assert [o["name"] for o in model["outputs"]] == ["output", "weights", "scores", "norm_weights"]
    assert client.get_model_metadata("attention", model_version="1")["name"] == "attention"


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("binary_in", [True, False], ids=["in:binary", "in:json"])
@pytest.mark.parametrize("binary_out", [True, False], ids=["out:binary", "out:json"])
def test_attention_round_trip(client, shape, binary_in: bool, binary_out: bool) -> None:
    q, k, v = qkv(shape)
    inputs = [tensor(n, a, "FP32", binary_in) for n, a in zip(("query", "key", "value"), (q, k, v), strict=True)]
    outputs = [triton.InferRequestedOutput(n, binary_data=binary_out) for n in ("output", "weights")]
    result = client.infer("attention", inputs, outputs=outputs)
    want = expected(q, k, v)
    out, weights = result.as_numpy("output"), result.as_numpy("weights")
    assert out.dtype == np.float32 and out.shape == shape
    assert weights.shape == shape[:-1] + (shape[2],)
    np.testing.assert_allclose(out, want.output, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(weights, want.weights, rtol=1e-6, atol=1e-7)
    params = result.get_response()["parameters"]
    assert params["engine"] == "numpy"
    diagnostics = json.loads(params["diagnostics"])
    assert np.array(diagnostics["entropy"]).shape == shape[:-1]
    assert diagnostics["fully_masked_rows"] == 0


def test_default_outputs_are_binary_and_exclude_scores(client) -> None:
    q, k, v = qkv((2, 3, 5))
    result = client.infer(
        "attention", [tensor(n, a, "FP32", True) for n, a in zip(("query", "key", "value"), (q, k, v), strict=True)]
    )
    response = result.get_response()
    assert [o["name"] for o in response["outputs"]] == ["output", "weights"]
    assert all("binary_data_size" in o["parameters"] for o in response["outputs"])
    np.testing.assert_allclose(result.as_numpy("output"), expected(q, k, v).output, rtol=1e-6, atol=1e-6)


def test_parameters_masks_and_fp64(client) -> None:
    q, k, v = qkv((2, 4, 6, 8), dtype=np.float64, seed=1)
    k, v = k[:, :2], v[:, :2]  # grouped-query: 4 query heads over 2 key/value heads
    mask = np.random.default_rng(2).random((2, 1, 6, 6)) > 0.3
    lengths = np.array([6, 4], dtype=np.int64)
    inputs = [
        tensor("query", q, "FP64", True),
        tensor("key", k, "FP64", False),
        tensor("value", v, "FP64", True),
        tensor("mask", mask, "BOOL", True),
        tensor("key_lengths", lengths, "INT64", False),
    ]
    outputs = [
        triton.InferRequestedOutput(n, binary_data=b)
        for n, b in (("weights", True), ("scores", True), ("output", False))
    ]
    params = {
        "normalizer": "entmax",
        "alpha": 1.3,
        "causal": "bottom_right",
        "temperature": 0.7,
        "scale": 0.5,
        "engine": "numpy",
    }
    result = client.infer("attention", inputs, outputs=outputs, parameters=params, request_id="r-7")
    want = expected(
        q,
        k,
        v,
        mask=mask,
        key_lengths=lengths,
        dtype=np.float64,
        normalizer="entmax",
        alpha=1.3,
        causal="bottom_right",
        temperature=0.7,
        scale=0.5,
    )
    assert result.get_response()["id"] == "r-7"
    assert result.as_numpy("output").dtype == np.float64
    np.testing.assert_allclose(result.as_numpy("output"), want.output, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(result.as_numpy("weights"), want.weights, rtol=1e-12, atol=1e-12)
    scores = result.as_numpy("scores")  # binary: masked positions arrive as -inf exactly
    assert np.array_equal(np.isneginf(scores), np.isneginf(want.scores))
    np.testing.assert_allclose(scores[np.isfinite(scores)], want.scores[np.isfinite(want.scores)], rtol=1e-12)


def test_subset_of_outputs_without_diagnostics(client) -> None:
    q, k, v = qkv((1, 2, 3, 4))
    result = client.infer(
        "attention",
        [tensor(n, a, "FP32", False) for n, a in zip(("query", "key", "value"), (q, k, v), strict=True)],
        outputs=[triton.InferRequestedOutput("weights", binary_data=False)],
        parameters={"diagnostics": False},
    )
    assert result.as_numpy("output") is None
    assert result.as_numpy("weights").shape == (1, 2, 3, 3)
    assert "diagnostics" not in result.get_response()["parameters"]


def test_softmax_model(client) -> None:
    logits = np.array([[1.0, 0.5, 2.5, -0.1], [2.1, 0.5, -1.2, 3.0]])
    result = client.infer(
        "softmax",
        [tensor("logits", logits, "FP64", True)],
        outputs=[
            triton.InferRequestedOutput("probabilities"),
            triton.InferRequestedOutput("log_probabilities", binary_data=False),
        ],
    )
    np.testing.assert_allclose(result.as_numpy("probabilities")[0], [0.1557, 0.0945, 0.6980, 0.0518], atol=1e-4)
    np.testing.assert_allclose(result.as_numpy("log_probabilities")[1], [-1.3079, -2.9079, -4.6079, -0.4079], atol=1e-4)


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compressed_request_and_response(client, algorithm: str) -> None:
    q, k, v = qkv((1, 8, 128, 64), seed=3)
    result = client.infer(
        "attention",
        [tensor(n, a, "FP32", True) for n, a in zip(("query", "key", "value"), (q, k, v), strict=True)],
        outputs=[triton.InferRequestedOutput("output"), triton.InferRequestedOutput("weights")],
        request_compression_algorithm=algorithm,
        response_compression_algorithm="gzip",
    )
    np.testing.assert_allclose(result.as_numpy("weights"), expected(q, k, v).weights, rtol=1e-6, atol=1e-7)


def test_binary_response_is_gzipped_with_the_uncompressed_header_length(live_server) -> None:
    q, k, v = qkv((1, 8, 128, 64), seed=4)
    header = json.dumps(
        {
            "inputs": [
                {"name": n, "shape": list(a.shape), "datatype": "FP32", "parameters": {"binary_data_size": a.nbytes}}
                for n, a in (("query", q), ("key", k), ("value", v))
            ],
            "outputs": [{"name": "weights", "parameters": {"binary_data": True}}],
        }
    ).encode()
    body = header + q.tobytes() + k.tobytes() + v.tobytes()
    headers = {"Inference-Header-Content-Length": str(len(header)), "Accept-Encoding": "gzip"}
    with httpx.Client(timeout=30) as http:
        r = http.post(live_server.url + "/v2/models/attention/infer", content=body, headers=headers)
    assert r.status_code == 200
    assert r.headers["content-encoding"] == "gzip"
    assert r.headers["content-type"] == "application/octet-stream"
    raw = r.content  # httpx has inflated it
    n = int(r.headers["inference-header-content-length"])
    header = json.loads(raw[:n])
    assert header["outputs"][0]["parameters"]["binary_data_size"] == len(raw) - n
    weights = np.frombuffer(raw[n:], dtype="<f4").reshape(header["outputs"][0]["shape"])
    np.testing.assert_allclose(weights, expected(q, k, v).weights, rtol=1e-6, atol=1e-7)


def test_errors_reach_the_client(client) -> None:
    q, k, v = qkv((1, 1, 4, 4))
    inputs = [tensor(n, a, "FP32", True) for n, a in zip(("query", "key", "value"), (q, k, v), strict=True)]
    with pytest.raises(InferenceServerException) as err:
        client.infer("nope", inputs)
    assert err.value.status() == "404" and "unknown model" in err.value.message()
    with pytest.raises(InferenceServerException) as err:
        client.infer("attention", inputs, parameters={"normalizer": "softermax"})
    assert err.value.status() == "400" and "normalizer" in err.value.message()


def test_gzip_bomb_is_refused(live_server) -> None:
    bomb = gzip.compress(b" " * (64 << 20), compresslevel=9)  # 64 MiB of JSON whitespace, over the 16 MiB cap
    with httpx.Client(timeout=30) as http:
        r = http.post(
            live_server.url + "/v2/models/attention/infer", content=bomb, headers={"Content-Encoding": "gzip"}
        )
    assert r.status_code == 413
    assert "inflates" in r.json()["error"]
