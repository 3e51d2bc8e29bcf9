"""The /v2 model attention_backward with the real Triton HTTP client against a live uvicorn server.

JSON and binary inputs and outputs, the golden backward cases, float masks and the response parameters,
compared with the numpy engine run in-process.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from service.core.backward import BackwardTask, run_backward
from service.core.types import AttentionInputs, AttentionParams, AttentionTask
from tests.golden import load, task_from_request

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def client(live_server):
    c = triton.InferenceServerClient(live_server.authority, connection_timeout=10.0, network_timeout=30.0)
    yield c
    c.close()


def tensor(name: str, arr: np.ndarray, binary: bool) -> triton.InferInput:
    datatype = {"float32": "FP32", "float64": "FP64", "bool": "BOOL", "int64": "INT64"}[arr.dtype.name]
    t = triton.InferInput(name, list(arr.shape), datatype)
    t.set_data_from_numpy(arr, binary_data=binary)
    return t


def test_metadata_and_readiness(client) -> None:
    assert client.is_model_ready("attention_backward")
    meta = client.get_model_metadata("attention_backward")
    assert [i["name"] for i in meta["inputs"]] == [
        "query",
        "key",
        "value",
        "mask",
        "key_lengths",
        "grad_output",
        "grad_weights",
    ]
    assert [o["name"] for o in meta["outputs"]][:3] == ["grad_query", "grad_key", "grad_value"]


@pytest.mark.parametrize("binary_in", [True, False], ids=["in:binary", "in:json"])
@pytest.mark.parametrize("binary_out", [True, False], ids=["out:binary", "out:json"])
@pytest.mark.parametrize("case", load("backward")[::3], ids=lambda c: c["request"]["normalizer"])
def test_golden_backward(client, case: dict, binary_in: bool, binary_out: bool) -> None:
    req = case["request"]
    task = task_from_request(req)
    inputs = [
        tensor("query", task.inputs.query, binary_in),
        tensor("key", task.inputs.key, binary_in),
        tensor("value", task.inputs.value, binary_in),
        tensor("grad_output", np.array(req["grad_output"], dtype=np.float64), binary_in),
    ]
    if task.inputs.mask is not None:
        inputs.append(tensor("mask", task.inputs.mask, binary_in))
    if task.inputs.key_lengths is not None:
        inputs.append(tensor("key_lengths", task.inputs.key_lengths.astype(np.int64), binary_in))
    params = {k: req[k] for k in ("normalizer", "temperature", "causal") if k in req}
    outputs = [triton.InferRequestedOutput(n, binary_data=binary_out) for n in ("grad_query", "grad_key", "grad_value")]
    result = client.infer("attention_backward", inputs, outputs=outputs, parameters=params)
    for name in ("grad_query", "grad_key", "grad_value"):
        got = result.as_numpy(name)
        assert got.dtype == np.float64
        np.testing.assert_allclose(got, np.array(case["expected"][name]), atol=1e-8, rtol=0, err_msg=name)


def test_float32_float_mask_and_response_parameters(client) -> None:
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 8, 128, 64), dtype=np.float32)
    k = rng.standard_normal((1, 2, 128, 64), dtype=np.float32)
    v = rng.standard_normal((1, 2, 128, 64), dtype=np.float32)
    g = rng.standard_normal((1, 8, 128, 64), dtype=np.float32)
    mask = rng.standard_normal((1, 1, 128, 128), dtype=np.float32)
    names = ("query", "key", "value", "grad_output", "mask")
    inputs = [tensor(n, a, True) for n, a in zip(names, (q, k, v, g, mask), strict=True)]
    outputs = [triton.InferRequestedOutput(n, binary_data=True) for n in ("grad_query", "grad_key", "grad_mask")]
    result = client.infer(
        "attention_backward",
        inputs,
        outputs=outputs,
        parameters={"causal": "bottom_right", "temperature": 0.5, "grad_scale": True, "gradient_health": True},
    )
    want = run_backward(
        BackwardTask(
            AttentionTask(
                AttentionInputs(q, k, v, mask),
                AttentionParams(causal="bottom_right", temperature=0.5),
                np.dtype(np.float32),
            ),
            g,
            want=frozenset({"grad_query", "grad_key", "grad_mask", "grad_scale", "gradient_health"}),
        )
    )
    np.testing.assert_allclose(result.as_numpy("grad_query"), want.grad_query, atol=1e-5)
    np.testing.assert_allclose(result.as_numpy("grad_key"), want.grad_key, atol=1e-4)
    assert result.as_numpy("grad_mask").shape == (1, 1, 128, 128)
    np.testing.assert_allclose(result.as_numpy("grad_mask"), want.grad_mask, atol=1e-5)
    params = result.get_response()["parameters"]
    assert params["grad_scale"] == pytest.approx(want.grad_scale, rel=1e-5)
    heads = json.loads(params["gradient_health"])["heads"]
    assert len(heads) == 8 and heads[0]["rows"] == 127  # causal: the first query row sees one key only
    assert params["engine"] in ("numpy", "onnx")


def test_bad_requests_are_400(client) -> None:
    q = np.zeros((2, 4), dtype=np.float32)
    with pytest.raises(InferenceServerException) as e:
        client.infer("attention_backward", [tensor(n, q, False) for n in ("query", "key", "value")])
    assert "grad_output" in str(e.value)
    with pytest.raises(InferenceServerException) as e:
        client.infer(
            "attention_backward",
            [tensor(n, q, False) for n in ("query", "key", "value")] + [tensor("grad_output", q[:, :3], False)],
        )
    assert "grad_output" in str(e.value)
