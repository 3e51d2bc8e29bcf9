"""The /v2 models ``sample`` and ``calibrate`` with the real Triton HTTP client against a live uvicorn server."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tritonclient.http as triton

from service.core import calibration, sampling
from tests import golden

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def client(live_server):
    c = triton.InferenceServerClient(live_server.authority, connection_timeout=10.0, network_timeout=30.0)
    yield c
    c.close()


def tensor(name: str, arr: np.ndarray, datatype: str, binary: bool) -> triton.InferInput:
    t = triton.InferInput(name, list(arr.shape), datatype)
    t.set_data_from_numpy(arr, binary_data=binary)
    return t


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_sample(client, binary: bool) -> None:
    assert client.is_model_ready("sample") and client.is_model_ready("calibrate")
    logits = np.random.default_rng(0).standard_normal((4, 32000)).astype(np.float32)
    previous = np.array([[1, 2, 2], [3, -1, -1], [-1, -1, -1], [7, 7, 7]], dtype=np.int64)
    params = {"temperature": 0.7, "top_k": 50, "top_p": 0.9, "repetition_penalty": 1.2, "n": 8, "seed": 2024}
    outputs = [triton.InferRequestedOutput(n, binary_data=binary) for n in ("tokens", "logprobs", "probabilities")]
    result = client.infer(
        "sample",
        [tensor("logits", logits, "FP32", binary), tensor("previous_tokens", previous, "INT64", binary)],
        outputs=outputs,
        parameters=params,
    )
    tokens, logp, probs = (result.as_numpy(n) for n in ("tokens", "logprobs", "probabilities"))
    filtered, _ = sampling.process(
        logits,
        sampling.SamplingParams(temperature=0.7, top_k=50, top_p=0.9, repetition_penalty=1.2),
        previous_tokens=previous,
    )
    want_tokens, want_logp = sampling.draw(filtered, sampling.uniforms(2024, (4, 8)))
    assert tokens.dtype == np.int64 and tokens.tolist() == want_tokens.tolist()
    np.testing.assert_allclose(logp, want_logp, rtol=1e-6)
    np.testing.assert_allclose(probs, filtered.dense(np.float32), rtol=1e-6, atol=1e-9)
    response = result.get_response()["parameters"]
    assert response["seed"] == 2024
    assert json.loads(response["diagnostics"])["kept"] == filtered.kept.tolist()


def test_calibrate(client) -> None:
    case = golden.load("calibrate")[1]
    logits = np.array(case["request"]["logits"], dtype=np.float64)
    labels = np.array(case["request"]["labels"], dtype=np.int64)
    result = client.infer(
        "calibrate",
        [tensor("logits", logits, "FP64", True), tensor("labels", labels, "INT64", True)],
        parameters={"bins": 10},
    )
    assert result.as_numpy("temperature")[0] == pytest.approx(case["temperature"], rel=1e-6)
    np.testing.assert_allclose(result.as_numpy("nll"), [case["nll"]["before"], case["nll"]["after"]], atol=1e-9)
    want = calibration.reliability(logits, labels, case["temperature"], bins=10)
    bins = json.loads(result.get_response()["parameters"]["reliability"])["after"]
    assert [b["count"] for b in bins] == want.count.tolist()
