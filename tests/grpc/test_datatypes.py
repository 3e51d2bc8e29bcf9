"""Issue 28 item 6 with the real Triton clients against a live server: FP16 inputs (computed in float32, answered in
FP32) and INT32 integer inputs, over gRPC (raw and typed contents) and REST (JSON and binary), and model metadata
that says which ranks each input takes.
"""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
from tritonclient.utils import InferenceServerException

from service.core.types import AttentionInputs, AttentionParams, AttentionTask
from service.engines.numpy_engine import NumpyEngine
from service.grpc.generated import inference_pb2 as pb
from service.grpc.generated import inference_pb2_grpc as pb_grpc
from tests.grpc.conftest import GrpcServer

RNG = np.random.default_rng(28)
DATATYPE = {np.float16: "FP16", np.float32: "FP32", np.float64: "FP64", np.int32: "INT32", np.int64: "INT64"}


@pytest.fixture(scope="module")
def clients(server: GrpcServer) -> Iterator[tuple[tg.InferenceServerClient, th.InferenceServerClient]]:
    over_grpc = tg.InferenceServerClient(server.target)
    over_rest = th.InferenceServerClient(server.url.removeprefix("http://"))
    yield over_grpc, over_rest
    over_grpc.close()
    over_rest.close()


def infer_all_ways(
    clients: tuple[tg.InferenceServerClient, th.InferenceServerClient], model: str, arrays: dict[str, np.ndarray]
) -> list[dict[str, np.ndarray]]:
    """The outputs over gRPC (raw contents), REST binary and REST JSON, each as name -> array."""
    over_grpc, over_rest = clients
    answers = []
    g_inputs = []
    for name, arr in arrays.items():
        t = tg.InferInput(name, list(arr.shape), DATATYPE[arr.dtype.type])
        t.set_data_from_numpy(arr)
        g_inputs.append(t)
    got = over_grpc.infer(model, g_inputs)
    answers.append({o.name: got.as_numpy(o.name) for o in got.get_response().outputs})
    for binary in (True, False):
        h_inputs = []
        for name, arr in arrays.items():
            t = th.InferInput(name, list(arr.shape), DATATYPE[arr.dtype.type])
            t.set_data_from_numpy(arr, binary_data=binary)
            h_inputs.append(t)
        got = over_rest.infer(model, h_inputs)
        answers.append({o["name"]: got.as_numpy(o["name"]) for o in got.get_response()["outputs"]})
    return answers


def float32_answer(arrays: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """What /v1 gives float16 tensors: the float32 computation of their values."""
    f32 = {n: a.astype(np.float32) if a.dtype == np.float16 else a for n, a in arrays.items()}
    task = AttentionTask(
        AttentionInputs(f32["query"], f32["key"], f32["value"], key_lengths=f32.get("key_lengths")),
        AttentionParams(),
        np.dtype(np.float32),
    )
    result = NumpyEngine().run(task)
    assert result.weights is not None
    return result.output, result.weights


def test_fp16_inputs_compute_in_float32_and_answer_fp32(clients) -> None:
    arrays = {n: RNG.standard_normal((2, 2, 3, 4)).astype(np.float16) for n in ("query", "key", "value")}
    output, weights = float32_answer(arrays)
    for answer in infer_all_ways(clients, "attention", arrays):
        assert answer["output"].dtype == np.float32 and answer["weights"].dtype == np.float32
        np.testing.assert_allclose(answer["output"], output, rtol=2e-6, atol=1e-6)
        np.testing.assert_allclose(answer["weights"], weights, rtol=2e-6, atol=1e-7)


def test_int32_key_lengths_mask_as_int64_ones_do(clients) -> None:
    arrays = {n: RNG.standard_normal((2, 1, 3, 4)).astype(np.float32) for n in ("query", "key", "value")}
    output, weights = float32_answer({**arrays, "key_lengths": np.array([1, 2], dtype=np.int64)})
    assert (weights[0, 0, :, 1:] == 0).all() and (weights[1, 0, :, 2:] == 0).all()  # the lengths mask keys
    for answer in infer_all_ways(clients, "attention", {**arrays, "key_lengths": np.array([1, 2], dtype=np.int32)}):
        np.testing.assert_allclose(answer["output"], output, rtol=2e-6, atol=1e-6)
        np.testing.assert_array_equal(answer["weights"] == 0, weights == 0)


def test_int32_key_lengths_in_typed_int_contents(server: GrpcServer) -> None:
    def tensor(name: str, arr: np.ndarray) -> pb.ModelInferRequest.InferInputTensor:
        t = pb.ModelInferRequest.InferInputTensor(name=name, datatype=DATATYPE[arr.dtype.type], shape=list(arr.shape))
        if arr.dtype == np.int32:
            t.contents.int_contents.extend(arr.ravel().tolist())
        else:
            t.contents.fp32_contents.extend(arr.ravel().tolist())
        return t

    arrays = {n: RNG.standard_normal((2, 1, 3, 4)).astype(np.float32) for n in ("query", "key", "value")}
    lengths = np.array([2, 1], dtype=np.int32)
    output, _ = float32_answer({**arrays, "key_lengths": lengths.astype(np.int64)})
    request = pb.ModelInferRequest(model_name="attention", inputs=[tensor(n, a) for n, a in arrays.items()])
    request.inputs.append(tensor("key_lengths", lengths))
    request.outputs.append(pb.ModelInferRequest.InferRequestedOutputTensor(name="output"))
    with grpc.insecure_channel(server.target) as channel:
        reply = pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=10)
    got = np.asarray(reply.outputs[0].contents.fp32_contents, dtype=np.float32).reshape(output.shape)
    np.testing.assert_allclose(got, output, rtol=2e-6, atol=1e-6)


def test_int32_token_ids_and_labels(clients) -> None:
    logits = np.array([[0.5, 2.0, -1.0, 0.25], [1.0, 0.0, 3.0, -2.0]], dtype=np.float16)
    labels = np.array([1, 2], dtype=np.int32)
    answers = infer_all_ways(clients, "calibrate", {"logits": logits, "labels": labels})
    expected = infer_all_ways(
        clients, "calibrate", {"logits": logits.astype(np.float32), "labels": labels.astype(np.int64)}
    )[0]
    for answer in answers:
        for name, value in expected.items():
            np.testing.assert_array_equal(answer[name], value)


def test_precisions_that_disagree_are_refused_naming_the_inputs(clients) -> None:
    over_grpc, _ = clients
    arrays = {"query": np.ones((2, 2), np.float16), "key": np.ones((2, 2), np.float64), "value": np.ones((2, 2))}
    inputs = []
    for name, arr in arrays.items():
        t = tg.InferInput(name, list(arr.shape), DATATYPE[arr.dtype.type])
        t.set_data_from_numpy(arr)
        inputs.append(t)
    with pytest.raises(InferenceServerException) as err:
        over_grpc.infer("attention", inputs)
    expected = "inputs query, key, value must share one precision (FP64, or FP32 and FP16), got FP16, FP64"
    assert expected in str(err.value)


def test_metadata_lists_the_ranks_and_datatypes_each_input_takes(server: GrpcServer, clients) -> None:
    meta = httpx.get(f"{server.url}/v2/models/attention", timeout=10).json()
    by_name = {t["name"]: t for t in meta["inputs"]}
    assert by_name["query"]["shape"] == [-1, -1, -1, -1] and by_name["query"]["ranks"] == [2, 3, 4]
    assert by_name["query"]["datatypes"] == ["FP32", "FP64", "FP16"]
    assert by_name["mask"]["ranks"] == [1, 2, 3, 4] and "FP16" in by_name["mask"]["datatypes"]
    assert by_name["key_lengths"]["ranks"] == [1] and by_name["key_lengths"]["datatypes"] == ["INT64", "INT32"]
    softmax = {t["name"]: t for t in httpx.get(f"{server.url}/v2/models/softmax", timeout=10).json()["inputs"]}
    assert softmax["logits"]["ranks"] == [1, 2, 3, 4]
    # over gRPC the one shape is the largest rank, which every input takes: a tool building inputs from it works
    over_grpc, _ = clients
    grpc_meta = over_grpc.get_model_metadata("attention")
    query = next(t for t in grpc_meta.inputs if t.name == "query")
    assert list(query.shape) == [-1, -1, -1, -1] and query.datatype == "FP32"
