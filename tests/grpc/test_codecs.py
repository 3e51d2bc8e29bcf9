"""``service/grpc/codecs.py`` without a server: the parameters of a ``ModelInferRequest`` (of the request, of each
input and of each output) read as REST reads them, the extensions this server does not serve refused naming where
they were asked for, and a message without parameters decoded as one with empty ones.
"""

from __future__ import annotations

import numpy as np
import pytest

from service.dataplane.errors import Kind, ServiceError
from service.dataplane.models import find_model
from service.dataplane.tensors import TensorLimits
from service.grpc.codecs import decode_request
from service.grpc.generated import inference_pb2 as pb

MODEL = find_model("attention", None)
LIMITS = TensorLimits(max_rank=4, max_dim=4096, max_elements=1 << 20)


def message() -> pb.ModelInferRequest:
    """query, key and value (1, 1, 2, 2) FP32 as raw contents; outputs output and weights."""
    request = pb.ModelInferRequest(model_name="attention")
    for i, name in enumerate(("query", "key", "value")):
        request.inputs.add(name=name, datatype="FP32", shape=[1, 1, 2, 2])
        request.raw_input_contents.append(np.arange(4, dtype="<f4").tobytes() if i else np.ones(4, "<f4").tobytes())
    for name in ("output", "weights"):
        request.outputs.add(name=name)
    return request


def decoded(request: pb.ModelInferRequest):  # type: ignore[no-untyped-def]
    return decode_request(request, MODEL.name, MODEL.inputs, MODEL.output_names, LIMITS)


def refusal(request: pb.ModelInferRequest) -> str:
    with pytest.raises(ServiceError) as err:
        decoded(request)
    assert err.value.kind is Kind.INVALID
    return str(err.value)


def test_a_message_without_parameters_decodes_with_none() -> None:
    request = decoded(message())
    assert request.parameters == {}
    assert request.outputs == {"output": True, "weights": True}  # raw in, raw out
    assert request.binary_default and request.outputs_given
    np.testing.assert_array_equal(request.inputs["query"], np.ones((1, 1, 2, 2), np.float32))
    np.testing.assert_array_equal(request.inputs["key"], np.arange(4, dtype=np.float32).reshape(1, 1, 2, 2))


def test_parameters_of_each_kind_are_read() -> None:
    request = message()
    request.parameters["temperature"].double_param = 0.5
    request.parameters["causal"].bool_param = True
    request.parameters["engine"].string_param = "numpy"
    request.parameters["sink_positions"].int64_param = 2
    assert decoded(request).parameters == {"temperature": 0.5, "causal": True, "engine": "numpy", "sink_positions": 2}


@pytest.mark.parametrize("key", ["shared_memory_region", "shared_memory_byte_size", "shared_memory_offset"])
def test_shared_memory_is_refused_where_it_is_asked_for(key: str) -> None:
    request = message()
    request.parameters[key].string_param = "r0"
    assert refusal(request) == "request: the shared memory extension is not supported; send the data in the body"
    request = message()
    request.inputs[1].parameters[key].string_param = "r0"
    assert refusal(request).startswith("input 'key': the shared memory extension is not supported")
    request = message()
    request.outputs[1].parameters[key].string_param = "r0"
    assert refusal(request).startswith("output 'weights': the shared memory extension is not supported")


def test_the_classification_extension_is_refused_naming_the_output() -> None:
    request = message()
    request.outputs[0].parameters["classification"].int64_param = 3
    assert refusal(request) == "output 'output': the classification extension is not supported"
