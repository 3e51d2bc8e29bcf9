"""The guarantees REST gives, over gRPC: refusals with the right status and REST's message, API keys, health
checking and reflection, size limits, admission and deadlines, concurrency, a graceful stop, metrics and logs.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as tg
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.grpc.conftest import API_KEY, GrpcServer
from tests.hardening.conftest import metric_value, wait_admitted

pytestmark = pytest.mark.slow

Q = np.random.default_rng(3).standard_normal((1, 1, 4, 4)).astype(np.float32)


def inputs(names: tuple[str, ...] = ("query", "key", "value"), arr: np.ndarray = Q, datatype: str = "FP32") -> list:
    out = []
    for name in names:
        t = tg.InferInput(name, list(arr.shape), datatype)
        t.set_data_from_numpy(arr)
        out.append(t)
    return out


def refusal(call: Any) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as err:
        call()
    return err.value


def rest_error(server: GrpcServer, model: str, body: dict[str, Any]) -> tuple[int, str]:
    r = httpx.post(f"{server.url}/v2/models/{model}/infer", json=body)
    return r.status_code, r.json()["error"]


def test_refusals_have_the_protocols_status_and_rests_message(server: GrpcServer) -> None:
    client = tg.InferenceServerClient(server.target)
    err = refusal(lambda: client.infer("attention", inputs(("query",))))
    assert err.status() == "StatusCode.INVALID_ARGUMENT"
    status, message = rest_error(
        server,
        "attention",
        {"inputs": [{"name": "query", "shape": [1, 1, 4, 4], "datatype": "FP32", "data": Q.ravel().tolist()}]},
    )
    assert status == 400 and err.message() == message == "model 'attention' needs input 'key', 'value'"
    err = refusal(lambda: client.infer("attention", inputs(), parameters={"temprature": 2.0}))
    assert err.status() == "StatusCode.INVALID_ARGUMENT" and "has no parameter 'temprature'" in err.message()
    err = refusal(lambda: client.infer("attention", inputs(), parameters={"temperature": -1.0}))
    assert err.status() == "StatusCode.INVALID_ARGUMENT" and err.message().startswith("parameter 'temperature'")
    err = refusal(
        lambda: client.infer("attention", inputs(datatype="FP64", arr=Q.astype(np.float64))[:2] + inputs(("value",)))
    )
    assert (
        err.status() == "StatusCode.INVALID_ARGUMENT"
        and "must share one precision (FP64, or FP32 and FP16)" in err.message()
    )
    err = refusal(lambda: client.infer("nope", inputs()))
    assert err.status() == "StatusCode.NOT_FOUND" and "unknown model 'nope'" in err.message()
    err = refusal(lambda: client.infer("attention", inputs(), model_version="7"))
    assert err.status() == "StatusCode.NOT_FOUND" and "has no version '7'" in err.message()
    big = np.ones((1, 1, 8192, 1), dtype=np.float32)  # bisection entmax over 8192 keys: over the work budget
    err = refusal(lambda: client.infer("attention", inputs(arr=big), parameters={"normalizer": "entmax", "alpha": 1.3}))
    assert err.status() == "StatusCode.RESOURCE_EXHAUSTED" and "estimated work" in err.message()
    nan = Q.copy()
    nan[0, 0, 1, 2] = np.nan
    err = refusal(lambda: client.infer("attention", inputs(arr=nan)))
    assert err.status() == "StatusCode.INVALID_ARGUMENT" and "query[0, 0, 1, 2] is nan" in err.message()


def test_an_overflow_names_the_protocols_remedy_as_rest_does(server: GrpcServer) -> None:
    """float32 scores that overflow: the remedy is the FP64 datatype (the protocol has no precision field)."""
    client = tg.InferenceServerClient(server.target)
    arrays = {"query": [[1e20]], "key": [[-1e20], [-1e20]], "value": [[1.0], [2.0]]}
    grpc_inputs, rest_inputs = [], []
    for name, values in arrays.items():
        arr = np.array(values, dtype=np.float32)
        t = tg.InferInput(name, list(arr.shape), "FP32")
        t.set_data_from_numpy(arr)
        grpc_inputs.append(t)
        rest_inputs.append({"name": name, "shape": list(arr.shape), "datatype": "FP32", "data": arr.ravel().tolist()})
    err = refusal(lambda: client.infer("attention", grpc_inputs))
    status, message = rest_error(server, "attention", {"inputs": rest_inputs})
    assert err.status() == "StatusCode.INVALID_ARGUMENT" and status == 400
    assert err.message() == message and "FP64" in message and "precision" not in message


def test_a_message_over_the_body_limit_is_resource_exhausted_with_the_limit(server: GrpcServer) -> None:
    client = tg.InferenceServerClient(server.target)
    huge = np.zeros((700, 16384), dtype=np.float32)  # 45.9 MB, over the server's 40 MiB
    err = refusal(lambda: client.infer("softmax", inputs(("logits",), huge)))
    assert err.status() == "StatusCode.RESOURCE_EXHAUSTED"
    assert str(40 << 20) in err.message(), err.message()


def test_api_keys_from_metadata(keyed_server: GrpcServer) -> None:
    client = tg.InferenceServerClient(keyed_server.target)
    err = refusal(lambda: client.infer("attention", inputs()))
    assert err.status() == "StatusCode.UNAUTHENTICATED" and "needs an API key" in err.message()
    err = refusal(lambda: client.infer("attention", inputs(), headers={"authorization": "Bearer wrong-key-0123456789"}))
    assert err.status() == "StatusCode.UNAUTHENTICATED" and err.message() == "the API key is not valid"
    for headers in ({"authorization": f"Bearer {API_KEY}"}, {"x-api-key": API_KEY}):
        assert client.infer("attention", inputs(), headers=headers).as_numpy("output").shape == (1, 1, 4, 4)
        assert client.is_server_ready(headers=headers)
    with grpc.insecure_channel(keyed_server.target) as channel:  # probes carry no key
        health = health_pb2_grpc.HealthStub(channel)
        assert health.Check(health_pb2.HealthCheckRequest()).status == health_pb2.HealthCheckResponse.SERVING


def test_health_check_and_watch_follow_readiness(server_with: Any) -> None:
    # The ONNX engine on: the server answers while it still starts, and health says so.
    server = server_with(ATTN_ENABLE_ONNX="true")
    with grpc.insecure_channel(server.target) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for name in ("", "inference.GRPCInferenceService"):
            assert (
                health.Check(health_pb2.HealthCheckRequest(service=name)).status
                == health_pb2.HealthCheckResponse.SERVING
            )
        with pytest.raises(grpc.RpcError) as err:
            health.Check(health_pb2.HealthCheckRequest(service="nope"))
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        watch = health.Watch(health_pb2.HealthCheckRequest(service=""))
        assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
        watch.cancel()


def test_reflection_lists_and_describes_the_services(server: GrpcServer) -> None:
    with grpc.insecure_channel(server.target) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        answers = list(
            stub.ServerReflectionInfo(
                iter(
                    [
                        reflection_pb2.ServerReflectionRequest(list_services=""),
                        reflection_pb2.ServerReflectionRequest(file_containing_symbol="inference.GRPCInferenceService"),
                    ]
                )
            )
        )
    names = {s.name for s in answers[0].list_services_response.service}
    assert {
        "inference.GRPCInferenceService",
        "grpc.health.v1.Health",
        "grpc.reflection.v1alpha.ServerReflection",
    } <= names
    from google.protobuf import descriptor_pb2

    file = descriptor_pb2.FileDescriptorProto.FromString(answers[1].file_descriptor_response.file_descriptor_proto[0])
    assert file.package == "inference" and [m.name for m in file.service[0].method][-3:] == [
        "ModelInfer",
        "ModelStreamInfer",
        "ModelStatistics",
    ]


def test_concurrent_clients(server: GrpcServer) -> None:
    def work(seed: int) -> bool:
        client = tg.InferenceServerClient(server.target)
        q = np.random.default_rng(seed).standard_normal((1, 2, 8, 8)).astype(np.float32)
        outs = [client.infer("attention", inputs(arr=q)).as_numpy("output") for _ in range(10)]
        return all(np.array_equal(outs[0], o) for o in outs)

    with ThreadPoolExecutor(8) as pool:
        assert all(pool.map(work, range(8)))


def test_metrics_by_protocol_and_request_ids_in_the_logs(server: GrpcServer) -> None:
    client = tg.InferenceServerClient(server.target)
    client.infer("softmax", inputs(("logits",)), headers={"x-request-id": "grpc-req-42"})
    refusal(lambda: client.infer("softmax", inputs(("nope",))))
    text = httpx.get(server.url + "/metrics").text
    route = "/inference.GRPCInferenceService/ModelInfer"
    assert (
        metric_value(text, "attn_http_requests_total", protocol="grpc", route=route, model="softmax", status="OK") >= 1
    )
    assert (
        metric_value(
            text, "attn_http_requests_total", protocol="grpc", route=route, model="softmax", status="INVALID_ARGUMENT"
        )
        >= 1
    )
    assert (
        metric_value(text, "attn_http_request_duration_seconds_count", protocol="grpc", route=route, model="softmax")
        >= 2
    )


def test_deadlines_and_admission(server_with: Any) -> None:
    # One compute slot, each call holds it 1 s (a test setting).
    server = server_with(ATTN_MAX_CONCURRENT_REQUESTS="1", ATTN_DEBUG_DELAY_S="1")
    client = tg.InferenceServerClient(server.target)
    client.infer("softmax", inputs(("logits",)))  # the service time is now known: about 1 s
    holder = threading.Thread(target=lambda: client.infer("softmax", inputs(("logits",))))
    holder.start()
    wait_admitted(server.url)
    t0 = time.monotonic()
    # A 0.6 s deadline against an expected wait of about 1 s: refused at once (milliseconds), with room for a
    # scheduler stall on a shared machine before the deadline itself would end the call.
    err = refusal(lambda: client.infer("softmax", inputs(("logits",)), client_timeout=0.6))
    assert time.monotonic() - t0 < 0.5  # refused at once: its deadline cannot be met
    assert err.status() == "StatusCode.DEADLINE_EXCEEDED" and "expected wait" in err.message()
    holder.join(10)
    text = httpx.get(server.url + "/metrics").text
    assert metric_value(text, "attn_http_requests_queued") == 0
    assert metric_value(text, "attn_http_requests_rejected_total", reason="deadline") >= 1


def test_overload_is_unavailable_with_retry_after(server_with: Any) -> None:
    server = server_with(ATTN_MAX_CONCURRENT_REQUESTS="1", ATTN_MAX_QUEUED_REQUESTS="0", ATTN_DEBUG_DELAY_S="3")
    holder = threading.Thread(
        target=lambda: httpx.post(server.url + "/v1/softmax", json={"logits": [1.0, 2.0]}, timeout=30)
    )
    holder.start()  # a REST request holds the only slot: gRPC queues behind REST
    wait_admitted(server.url)
    with grpc.insecure_channel(server.target) as channel:
        from service.grpc.generated import inference_pb2 as pb
        from service.grpc.generated import inference_pb2_grpc as pb_grpc

        request = pb.ModelInferRequest(model_name="softmax")
        request.inputs.add(name="logits", datatype="FP64", shape=[2]).contents.fp64_contents.extend([1.0, 2.0])
        with pytest.raises(grpc.RpcError) as err:
            pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE and "at capacity" in err.value.details()
    assert int(dict(err.value.trailing_metadata())["retry-after"]) >= 1
    holder.join(30)


def test_both_protocols_admit_the_same_paths(server_with: Any) -> None:
    """Issue 29 item 1: inference is admitted on both protocols (one door), metadata and health on neither: with
    the only slot taken and no queue, REST's metadata is answered as gRPC's is (it was 503 over REST), and an
    inference is refused on both.
    """
    server = server_with(ATTN_MAX_CONCURRENT_REQUESTS="1", ATTN_MAX_QUEUED_REQUESTS="0", ATTN_DEBUG_DELAY_S="5")
    holder = threading.Thread(
        target=lambda: httpx.post(server.url + "/v1/softmax", json={"logits": [1.0, 2.0]}, timeout=30)
    )
    holder.start()
    wait_admitted(server.url)  # the slot is held for 5 s from here: room for nine calls on a busy machine
    try:
        for path in ("/v2/models/attention", "/v2", "/v2/health/ready", "/v2/models/stats", "/readyz"):
            assert httpx.get(server.url + path, timeout=5).status_code == 200, path
        client = tg.InferenceServerClient(server.target)
        assert client.get_model_metadata("attention").name == "attention" and client.is_server_ready()
        infer = {"inputs": [{"name": "logits", "shape": [2], "datatype": "FP64", "data": [1.0, 2.0]}]}
        assert httpx.post(server.url + "/v2/models/softmax/infer", json=infer, timeout=5).status_code == 503
        assert httpx.post(server.url + "/v1/softmax", json={"logits": [1.0]}, timeout=5).status_code == 503
        err = refusal(lambda: client.infer("softmax", inputs(("logits",))))
        assert err.status() == "StatusCode.UNAVAILABLE" and "at capacity" in err.message()
    finally:
        holder.join(30)


def test_sigterm_answers_the_call_in_flight_and_takes_no_new_one(server_with: Any) -> None:
    server = server_with(ATTN_DEBUG_DELAY_S="2", ATTN_SHUTDOWN_GRACE_S="20")
    assert server.pid is not None
    result: dict[str, Any] = {}

    def call() -> None:
        client = tg.InferenceServerClient(server.target)
        result["output"] = client.infer("softmax", inputs(("logits",))).as_numpy("probabilities")

    worker = threading.Thread(target=call)
    worker.start()
    wait_admitted(server.url)  # the call is in flight, holding its slot inside the server for 2 s
    os.kill(server.pid, signal.SIGTERM)
    time.sleep(0.3)
    with pytest.raises(InferenceServerException):  # no new call once stopping
        tg.InferenceServerClient(server.target).infer("softmax", inputs(("logits",)), client_timeout=2)
    worker.join(30)
    assert result["output"].shape == Q.shape  # answered, not cut off


def test_the_request_id_comes_back_in_the_trailing_metadata(server: GrpcServer, keyed_server: GrpcServer) -> None:
    """Sent with the status (initial metadata sent on its own cost a tenth of a millisecond a call): the caller's
    id when it is safe, else a new one; on answers and on refusals, beside ``retry-after`` where there is one.
    """
    from service.grpc.generated import inference_pb2 as pb
    from service.grpc.generated import inference_pb2_grpc as pb_grpc

    def trailing(target: str, request: Any, metadata: tuple[tuple[str, str], ...] = ()) -> tuple[Any, dict[str, str]]:
        with grpc.insecure_channel(target) as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            try:
                _, call = stub.ModelInfer.with_call(request, metadata=metadata, timeout=30)
                return grpc.StatusCode.OK, dict(call.trailing_metadata())
            except grpc.RpcError as err:
                return err.code(), dict(err.trailing_metadata())  # type: ignore[attr-defined]

    good = pb.ModelInferRequest(model_name="softmax")
    good.inputs.add(name="logits", datatype="FP32", shape=[1, 3]).contents.fp32_contents.extend([1.0, 2.0, 3.0])
    code, meta = trailing(server.target, good, (("x-request-id", "grpc-trail-7"),))
    assert code == grpc.StatusCode.OK and meta["x-request-id"] == "grpc-trail-7"
    code, meta = trailing(server.target, pb.ModelInferRequest(model_name="nope"), (("x-request-id", "bad id!"),))
    assert code == grpc.StatusCode.NOT_FOUND and len(meta["x-request-id"]) == 32  # unsafe in logs: a new id
    code, meta = trailing(keyed_server.target, good, (("x-request-id", "grpc-trail-8"),))
    assert code == grpc.StatusCode.UNAUTHENTICATED and meta["x-request-id"] == "grpc-trail-8"
