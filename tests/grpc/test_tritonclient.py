"""The gRPC front end with the real Triton gRPC client against a live server: every model answers as /v2 over
REST does (same outputs, same response parameters), the golden cases hold, and raw and typed contents agree.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th

from service.grpc.generated import inference_pb2 as pb
from service.grpc.generated import inference_pb2_grpc as pb_grpc
from tests.golden import load, tolerance
from tests.grpc.conftest import GrpcServer

pytestmark = pytest.mark.slow

RNG = np.random.default_rng(7)
DATATYPE = {np.dtype(np.float32): "FP32", np.dtype(np.float64): "FP64", np.dtype(bool): "BOOL"}
DATATYPE[np.dtype(np.int64)] = "INT64"


@pytest.fixture(scope="module")
def clients(server: GrpcServer) -> Iterator[tuple[tg.InferenceServerClient, th.InferenceServerClient]]:
    over_grpc = tg.InferenceServerClient(server.target)
    over_rest = th.InferenceServerClient(server.url.removeprefix("http://"))
    yield over_grpc, over_rest
    over_grpc.close()
    over_rest.close()


def grpc_inputs(arrays: dict[str, np.ndarray]) -> list[tg.InferInput]:
    inputs = []
    for name, arr in arrays.items():
        t = tg.InferInput(name, list(arr.shape), DATATYPE[arr.dtype])
        t.set_data_from_numpy(arr)
        inputs.append(t)
    return inputs


def rest_inputs(arrays: dict[str, np.ndarray]) -> list[th.InferInput]:
    inputs = []
    for name, arr in arrays.items():
        t = th.InferInput(name, list(arr.shape), DATATYPE[arr.dtype])
        t.set_data_from_numpy(arr, binary_data=True)
        inputs.append(t)
    return inputs


def both(
    clients: tuple[tg.InferenceServerClient, th.InferenceServerClient],
    model: str,
    arrays: dict[str, np.ndarray],
    outputs: list[str],
    **parameters: Any,
) -> tuple[Any, Any]:
    over_grpc, over_rest = clients
    g = over_grpc.infer(
        model, grpc_inputs(arrays), outputs=[tg.InferRequestedOutput(n) for n in outputs], parameters=parameters
    )
    r = over_rest.infer(
        model,
        rest_inputs(arrays),
        outputs=[th.InferRequestedOutput(n, binary_data=True) for n in outputs],
        parameters=parameters,
    )
    return g, r


def comparable(parameters: dict[str, Any]) -> dict[str, Any]:
    """Response parameters without the timings, JSON text decoded."""
    out = {}
    for key, value in parameters.items():
        if key == "timing_ms":
            continue
        out[key] = json.loads(value) if isinstance(value, str) and value[:1] in "[{" else value
    return out


def grpc_parameters(result: tg.InferResult) -> dict[str, Any]:
    params = result.get_response().parameters
    return {k: getattr(v, v.WhichOneof("parameter_choice")) for k, v in params.items()}


def assert_same(g: Any, r: Any, outputs: list[str]) -> None:
    for name in outputs:
        a, b = g.as_numpy(name), r.as_numpy(name)
        assert a.dtype == b.dtype and a.shape == b.shape, name
        np.testing.assert_array_equal(a, b)
    assert comparable(grpc_parameters(g)) == comparable(r.get_response().get("parameters", {}))


def qkv(shape: tuple[int, ...], dtype: type = np.float32) -> dict[str, np.ndarray]:
    return {n: RNG.standard_normal(shape).astype(dtype) for n in ("query", "key", "value")}


def test_health_and_metadata(clients: tuple[tg.InferenceServerClient, th.InferenceServerClient]) -> None:
    over_grpc, _ = clients
    assert over_grpc.is_server_live() and over_grpc.is_server_ready()
    for model in ("attention", "softmax", "attention_backward", "sample", "calibrate"):
        assert over_grpc.is_model_ready(model) and over_grpc.is_model_ready(model, "1")
    meta = over_grpc.get_server_metadata()
    assert meta.name == "attention-service"
    assert list(meta.extensions) == [
        "binary_tensor_data",
        "parameters",
        "statistics",
        "sequence",
        "sequence(string_id)",
    ]
    model = over_grpc.get_model_metadata("attention")
    assert [i.name for i in model.inputs] == ["query", "key", "value", "mask", "key_lengths", "token_ids"]
    assert [o.name for o in model.outputs] == ["output", "weights", "scores", "norm_weights"]
    assert list(model.versions) == ["1"] and model.platform == "attention_service"
    assert list(model.inputs[4].shape) == [-1] and model.inputs[4].datatype == "INT64"


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["FP32", "FP64"])
def test_attention_with_bool_mask_and_key_lengths_as_over_rest(
    clients: tuple[tg.InferenceServerClient, th.InferenceServerClient], dtype: type
) -> None:
    arrays = qkv((2, 4, 6, 8), dtype)
    arrays["mask"] = RNG.random((2, 1, 6, 6)) > 0.3
    arrays["key_lengths"] = np.array([6, 4], dtype=np.int64)
    outputs = ["output", "weights", "scores"]
    g, r = both(clients, "attention", arrays, outputs, causal="bottom_right", temperature=0.7, normalizer="entmax15")
    assert g.as_numpy("output").dtype == np.dtype(dtype)
    assert_same(g, r, outputs)
    params = grpc_parameters(g)
    assert params["engine"] == "numpy" and "entropy" in json.loads(params["diagnostics"])
    assert set(json.loads(params["timing_ms"])) >= {"decode", "compute", "total"}


def test_softmax_sample_calibrate_and_backward_as_over_rest(
    clients: tuple[tg.InferenceServerClient, th.InferenceServerClient],
) -> None:
    logits = RNG.standard_normal((3, 50)).astype(np.float32)
    g, r = both(clients, "softmax", {"logits": logits}, ["probabilities", "log_probabilities"], normalizer="softmax")
    assert_same(g, r, ["probabilities", "log_probabilities"])

    previous = np.array([[1, 2, 2], [4, -1, -1], [0, 0, 0]], dtype=np.int64)
    g, r = both(
        clients,
        "sample",
        {"logits": logits, "previous_tokens": previous},
        ["tokens", "logprobs", "probabilities"],
        seed=11,
        n=4,
        top_k=10,
        top_p=0.9,
        repetition_penalty=1.3,
        top_logprobs=3,
    )
    assert_same(g, r, ["tokens", "logprobs", "probabilities"])
    assert grpc_parameters(g)["seed"] == 11

    labels = RNG.integers(0, 50, 3).astype(np.int64)
    g, r = both(clients, "calibrate", {"logits": logits.astype(np.float64), "labels": labels}, ["temperature", "ece"])
    assert_same(g, r, ["temperature", "ece"])

    arrays = qkv((1, 2, 4, 8), np.float64)
    arrays["grad_output"] = RNG.standard_normal((1, 2, 4, 8))
    outs = ["grad_query", "grad_key", "grad_value"]
    g, r = both(clients, "attention_backward", arrays, outs, grad_scale=True, gradient_health=True)
    assert_same(g, r, outs)
    assert isinstance(grpc_parameters(g)["grad_scale"], float)


def golden_arrays(request: dict[str, Any]) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    dtype = np.float64 if request.get("precision") == "float64" else np.float32
    arrays = {n: np.array(request[n], dtype=dtype) for n in ("query", "key", "value")}
    if request.get("mask") is not None:
        mask = np.array(request["mask"])
        arrays["mask"] = mask if mask.dtype == bool else mask.astype(dtype)
    if request.get("key_lengths") is not None:
        arrays["key_lengths"] = np.array(request["key_lengths"], dtype=np.int64)
    params = {k: request[k] for k in ("normalizer", "alpha", "scale", "temperature", "causal") if k in request}
    return arrays, params


@pytest.mark.parametrize(
    "case",
    load("attention"),
    ids=lambda c: json.dumps({k: v for k, v in c["request"].items() if k not in ("query", "key", "value", "mask")})[
        :80
    ],
)
def test_golden_attention_cases(
    clients: tuple[tg.InferenceServerClient, th.InferenceServerClient], case: dict[str, Any]
) -> None:
    arrays, params = golden_arrays(case["request"])
    result = clients[0].infer(
        "attention",
        grpc_inputs(arrays),
        outputs=[tg.InferRequestedOutput(n) for n in ("output", "weights")],
        parameters=params,
    )
    tol = tolerance(case["request"]) if case["request"].get("precision") == "float64" else 1e-5
    for name in ("output", "weights"):
        np.testing.assert_allclose(result.as_numpy(name), np.array(case["expected"][name]), atol=tol, rtol=tol)


def typed_request(model: str, arrays: dict[str, np.ndarray], outputs: list[str]) -> pb.ModelInferRequest:
    field = {"FP32": "fp32_contents", "FP64": "fp64_contents", "BOOL": "bool_contents", "INT64": "int64_contents"}
    request = pb.ModelInferRequest(model_name=model)
    for name, arr in arrays.items():
        datatype = DATATYPE[arr.dtype]
        tensor = request.inputs.add(name=name, datatype=datatype, shape=arr.shape)
        getattr(tensor.contents, field[datatype]).extend(arr.ravel().tolist())
    for name in outputs:
        request.outputs.add(name=name)
    return request


def test_typed_contents_answer_typed_and_equal_raw(
    server: GrpcServer, clients: tuple[tg.InferenceServerClient, th.InferenceServerClient]
) -> None:
    arrays = qkv((1, 2, 5, 4), np.float64)
    arrays["mask"] = RNG.random((5, 5)) > 0.2
    with grpc.insecure_channel(server.target) as channel:
        typed = pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(
            typed_request("attention", arrays, ["output", "weights"])
        )
    assert not typed.raw_output_contents
    raw = clients[0].infer(
        "attention", grpc_inputs(arrays), outputs=[tg.InferRequestedOutput(n) for n in ("output", "weights")]
    )
    for i, name in enumerate(("output", "weights")):
        out = typed.outputs[i]
        assert out.name == name and out.datatype == "FP64"
        np.testing.assert_array_equal(np.array(out.contents.fp64_contents).reshape(out.shape), raw.as_numpy(name))


def test_a_30_mb_request(clients: tuple[tg.InferenceServerClient, th.InferenceServerClient]) -> None:
    logits = RNG.standard_normal((480, 16384)).astype(np.float32)  # 31.5 MB, above gRPC's 4 MiB default
    result = clients[0].infer("softmax", grpc_inputs({"logits": logits}), parameters={"diagnostics": False})
    probabilities = result.as_numpy("probabilities")
    assert probabilities.shape == logits.shape
    np.testing.assert_allclose(probabilities.sum(-1), 1.0, rtol=1e-5)
