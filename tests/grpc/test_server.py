"""service.grpc in-process: health follows the engines' start-up, and the codecs refuse malformed messages with
a message naming the input.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from service.dataplane.errors import ServiceError
from service.dataplane.models import MODELS
from service.dataplane.plane import DataPlane
from service.dataplane.tensors import TensorLimits
from service.engines.numpy_engine import NumpyEngine
from service.grpc.codecs import decode_request, encode_response, parameter_value
from service.grpc.generated import inference_pb2 as pb
from service.grpc.server import GrpcServer, server_options
from service.observability.metrics import ServiceMetrics
from service.settings import Settings


class SlowStart(NumpyEngine):
    """numpy, whose start waits for a signal: the service is not ready until then."""

    def __init__(self) -> None:
        super().__init__(threads=1)
        self.go = threading.Event()
        self.started = False

    def start(self) -> None:
        self.go.wait(10)
        self.started = True

    @property
    def ready(self) -> bool:
        return self.started


def health_status(port: int) -> Any:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service="")).status


def test_health_is_not_serving_until_the_engines_are_ready() -> None:
    engine = SlowStart()
    settings = Settings(enable_onnx=False, grpc_port=0)
    plane = DataPlane(settings, {"numpy": engine})

    async def scenario() -> list[Any]:
        server = GrpcServer(plane, ServiceMetrics())
        port = await server.start()
        threading.Thread(target=plane.runtime.start_engines, daemon=True).start()
        seen = [await asyncio.to_thread(health_status, port)]
        engine.go.set()
        for _ in range(100):
            status = await asyncio.to_thread(health_status, port)
            if status == health_pb2.HealthCheckResponse.SERVING:
                break
            await asyncio.sleep(0.05)
        seen.append(status)
        await server.stop(1.0)
        return seen

    assert asyncio.run(scenario()) == [
        health_pb2.HealthCheckResponse.NOT_SERVING,
        health_pb2.HealthCheckResponse.SERVING,
    ]


def test_server_options_follow_the_settings() -> None:
    options = dict(server_options(Settings(enable_onnx=False, max_body_bytes=40 << 20, workers=1)))
    assert options["grpc.max_receive_message_length"] == 40 << 20
    assert options["grpc.so_reuseport"] == 0 and "grpc.max_connection_age_ms" not in options
    aged = dict(server_options(Settings(enable_onnx=False, grpc_max_connection_age_s=600)))
    assert aged["grpc.max_connection_age_ms"] == 600_000


LIMITS = TensorLimits()
ATTENTION = MODELS["attention"]


def raw_request(arrays: dict[str, np.ndarray], datatype: str = "FP32") -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="attention")
    for name, arr in arrays.items():
        request.inputs.add(name=name, datatype=datatype, shape=arr.shape)
        request.raw_input_contents.append(arr.tobytes())
    return request


def decode(request: pb.ModelInferRequest) -> Any:
    return decode_request(request, "attention", ATTENTION.inputs, ATTENTION.output_names, LIMITS)


def refused(request: pb.ModelInferRequest) -> str:
    with pytest.raises(ServiceError) as err:
        decode(request)
    return err.value.message


Q = np.arange(8, dtype=np.float32).reshape(1, 2, 4)


def test_raw_inputs_are_views_of_the_message() -> None:
    decoded = decode(raw_request({"query": Q, "key": Q, "value": Q}))
    np.testing.assert_array_equal(decoded.inputs["query"], Q)
    assert not decoded.inputs["query"].flags.owndata  # np.frombuffer: no copy
    assert decoded.binary_default and decoded.datatypes == {"query": "FP32", "key": "FP32", "value": "FP32"}


def test_malformed_messages_are_refused_naming_the_input() -> None:
    request = raw_request({"query": Q, "key": Q, "value": Q})
    request.raw_input_contents[1] = request.raw_input_contents[1][:-4]
    assert refused(request) == "input 'key': raw_input_contents has 28 bytes, but shape [1, 2, 4] needs 32 bytes"
    request = raw_request({"query": Q, "key": Q, "value": Q})
    del request.raw_input_contents[2]
    assert "raw_input_contents has 2 entries for 3 inputs" in refused(request)
    request = raw_request({"query": Q, "key": Q, "value": Q})
    request.inputs[0].contents.fp32_contents.extend([1.0])
    assert "input 'query' has contents" in refused(request)
    typed = pb.ModelInferRequest(model_name="attention")
    typed.inputs.add(name="query", datatype="FP32", shape=[1, 2, 4]).contents.fp32_contents.extend([1.0] * 7)
    assert refused(typed) == "input 'query': fp32_contents has 7 values but shape [1, 2, 4] needs 8"
    bad_type = raw_request({"query": Q}, datatype="INT8")
    assert refused(bad_type) == "input 'query' has datatype 'INT8'; it takes FP32 or FP64 or FP16"
    unknown = raw_request({"queries": Q})
    assert "model 'attention' has no input 'queries'" in refused(unknown)
    request = raw_request({"query": Q, "key": Q, "value": Q})
    request.outputs.add(name="nope")
    assert "model 'attention' has no output 'nope'" in refused(request)


def test_parameters_both_ways() -> None:
    request = pb.ModelInferRequest()
    request.parameters["a"].bool_param = True
    request.parameters["b"].int64_param = 3
    request.parameters["c"].double_param = 0.5
    request.parameters["d"].string_param = "x"
    request.parameters["e"].uint64_param = 7
    assert {k: parameter_value(v) for k, v in request.parameters.items()} == {
        "a": True,
        "b": 3,
        "c": 0.5,
        "d": "x",
        "e": 7,
    }
    from service.dataplane.inference import InferRequest, InferResult

    result = InferResult([("output", Q)], {"engine": "numpy", "seed": 4, "grad_scale": 0.25, "bounded": False})
    response = encode_response("attention", "1", InferRequest("id-1", {}, {}, {}), result)
    assert response.id == "id-1" and not response.raw_output_contents
    assert list(response.outputs[0].contents.fp32_contents) == Q.ravel().tolist()
    assert {k: parameter_value(v) for k, v in response.parameters.items()} == result.parameters
