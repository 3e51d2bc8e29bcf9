"""Between the protocol's protobuf messages and the data plane's decoded requests and results.

Inputs come as ``raw_input_contents`` (one bytes entry per input, read with ``np.frombuffer``: no copy; a large
message's entries are views of the message itself, :mod:`service.grpc.wire`) or as typed ``contents`` (the
repeated field of the datatype); outputs go back raw when the request was raw, typed otherwise. Parameters map
to Python values (bool, int, str, float) both ways. Every refusal is an ``INVALID`` service error naming the
input, output or parameter, in the words REST uses.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from service.dataplane.context import Context
from service.dataplane.errors import invalid
from service.dataplane.inference import (
    OUTPUT_DATATYPES,
    InferRequest,
    InferResult,
    TensorSpec,
    check_complete,
    check_input_shape,
    check_output,
    input_dtype,
    input_spec,
    output_as_binary,
    refuse_shared_memory,
)
from service.dataplane.models import MODEL_VERSION, Model, find_model
from service.dataplane.tensors import TensorLimits
from service.grpc.generated import inference_pb2 as pb
from service.grpc.wire import InferMessage

CONTENTS_FIELD = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
}
"""The typed field that carries each datatype's values (FP16 has none: it travels raw only)."""


def parameter_value(param: pb.InferParameter) -> Any:
    """A protocol parameter as a Python value; an empty parameter is None."""
    choice = param.WhichOneof("parameter_choice")
    return None if choice is None else getattr(param, choice)


def parameters(params: Mapping[str, pb.InferParameter]) -> dict[str, Any]:
    """A message's parameters as Python values (most messages send none: an empty map is not walked)."""
    return {key: parameter_value(value) for key, value in params.items()} if params else {}


def set_parameter(param: pb.InferParameter, value: Any) -> None:
    """Write a response parameter: a bool, an int, a float or (anything else) its text."""
    if isinstance(value, bool | np.bool_):
        param.bool_param = bool(value)
    elif isinstance(value, int | np.integer):
        param.int64_param = int(value)
    elif isinstance(value, float | np.floating):
        param.double_param = float(value)
    else:
        param.string_param = str(value)


def _raw(data: bytes | memoryview, dtype: np.dtype, shape: tuple[int, ...], name: str) -> np.ndarray:
    expected = math.prod(shape) * dtype.itemsize
    if len(data) != expected:
        raise invalid(
            f"input {name!r}: raw_input_contents has {len(data)} bytes, but shape {list(shape)} needs {expected} bytes"
        )
    if dtype.kind == "b":
        ints = np.frombuffer(data, dtype=np.uint8)
        if (ints > 1).any():
            raise invalid(f"input {name!r}: BOOL bytes must be 0 or 1")
        return ints.view(bool).reshape(shape)
    arr = np.frombuffer(data, dtype=dtype).reshape(shape)
    return arr if arr.flags.aligned else arr.copy()


def _typed(
    contents: pb.InferTensorContents, datatype: str, dtype: np.dtype, shape: tuple[int, ...], name: str
) -> np.ndarray:
    name_field = CONTENTS_FIELD.get(datatype)
    count = math.prod(shape)
    if name_field is None:
        raise invalid(f"input {name!r}: datatype {datatype} has no typed contents; send it in raw_input_contents")
    values = getattr(contents, name_field)
    if len(values) != count:
        raise invalid(f"input {name!r}: {name_field} has {len(values)} values but shape {list(shape)} needs {count}")
    if dtype.kind == "f":  # numbers stay float64 until the cast to the compute precision, as JSON data does
        return np.array(values, dtype=np.float64 if datatype == "FP64" else dtype).reshape(shape)
    info = np.iinfo(dtype) if dtype.kind in "iu" else None
    arr = np.array(values, dtype=np.int64 if info is not None and dtype.kind == "i" else None)
    if info is not None and arr.size and (arr.min() < info.min or arr.max() > info.max):
        i = int(np.argmax((arr < info.min) | (arr > info.max)))
        raise invalid(
            f"input {name!r}: {name_field}[{i}] = {arr[i]} is out of range for {datatype} ({info.min} to {info.max})"
        )
    return arr.astype(dtype).reshape(shape)


def decode_request(
    request: pb.ModelInferRequest,
    model: str,
    inputs: Sequence[TensorSpec],
    outputs: Sequence[str],
    limits: TensorLimits,
    contents: Sequence[bytes | memoryview] | None = None,
) -> InferRequest:
    """The decoded request: each input checked against the model (datatype, shape, size) and turned into an
    array, the outputs asked for, the parameters as Python values. A raw request gets raw outputs. ``contents``:
    the raw input contents, where they do not come in ``request`` (:class:`~service.grpc.wire.InferMessage`).
    """
    params = parameters(request.parameters)
    refuse_shared_memory(params, "request")
    raw = request.raw_input_contents if contents is None else contents
    if raw and len(raw) != len(request.inputs):
        raise invalid(
            f"raw_input_contents has {len(raw)} entries for {len(request.inputs)} inputs: one per input, in order"
        )
    if not request.inputs and any(not s.optional for s in inputs):
        raise invalid("inputs must be a non-empty list of input tensors")  # (a session's end may send none)
    specs = {s.name: s for s in inputs}
    arrays: dict[str, np.ndarray] = {}
    datatypes: dict[str, str] = {}
    for i, tensor in enumerate(request.inputs):
        name = tensor.name
        spec = input_spec(model, specs, name, arrays)
        dtype = input_dtype(spec, tensor.datatype)
        shape = tuple(tensor.shape)
        if any(d < 0 for d in shape):
            raise invalid(f"input {name!r}: shape must be a list of non-negative integers")
        check_input_shape(spec, shape, limits)
        refuse_shared_memory(parameters(tensor.parameters), f"input {name!r}")
        if raw:
            if tensor.HasField("contents"):
                raise invalid(f"input {name!r} has contents, but the request sends raw_input_contents for every input")
            arrays[name] = _raw(raw[i], dtype, shape, name)
        else:
            arrays[name] = _typed(tensor.contents, tensor.datatype, dtype, shape, name)
        datatypes[name] = tensor.datatype
    check_complete(model, inputs, arrays)
    requested: dict[str, bool] = {}
    for out in request.outputs:
        check_output(model, outputs, requested, out.name)
        out_params = parameters(out.parameters)
        refuse_shared_memory(out_params, f"output {out.name!r}")
        output_as_binary(out.name, out_params, bool(raw))  # refuses the classification extension
        requested[out.name] = bool(raw)  # over gRPC, outputs go back in the form the inputs came
    return InferRequest(
        request.id or None, params, arrays, datatypes, requested, bool(request.outputs), binary_default=bool(raw)
    )


def encode_response(model: str, version: str, request: InferRequest, result: InferResult) -> pb.ModelInferResponse:
    """The response of ``result``: outputs raw (``raw_output_contents``) when the request was raw, else typed."""
    response = pb.ModelInferResponse(model_name=model, model_version=version, id=request.id or "")
    for key, value in result.parameters.items():
        set_parameter(response.parameters[key], value)
    raw_outputs: list[bytes] = []
    for name, arr in result.outputs:
        datatype = OUTPUT_DATATYPES[arr.dtype]
        tensor = response.outputs.add(name=name, datatype=datatype, shape=arr.shape)
        flat = np.ascontiguousarray(arr).reshape(-1)
        if request.outputs.get(name, request.binary_default):
            if flat.dtype.byteorder == ">":
                flat = flat.astype(flat.dtype.newbyteorder("<"))
            raw_outputs.append(flat.tobytes())
        else:
            getattr(tensor.contents, CONTENTS_FIELD[datatype]).extend(flat.tolist())
    if raw_outputs:
        response.raw_output_contents.extend(raw_outputs)
    return response


class GrpcCodec:
    """``ModelInfer``'s wire form, as the data plane's door takes it (:class:`~service.dataplane.door.Codec`):
    :func:`decode_request` and :func:`encode_response`.
    """

    def decode(self, ctx: Context, operation: object, raw: InferMessage, caller: str) -> InferRequest:
        assert isinstance(operation, Model), operation  # the message names a model of the protocol
        limits = operation.input_limits(ctx)
        contents = raw.take_contents()
        request = decode_request(
            raw.request, operation.name, operation.inputs, operation.output_names, limits, contents
        )
        request.caller = caller
        return request

    def encode(self, operation: object, request: InferRequest, result: InferResult) -> pb.ModelInferResponse:
        assert isinstance(operation, Model), operation
        return encode_response(operation.name, MODEL_VERSION, request, result)


GRPC_CODEC = GrpcCodec()


def named_model(message: InferMessage) -> Model:
    """The model a ``ModelInfer`` message names (``NOT_FOUND`` for an unknown model or version)."""
    return find_model(message.request.model_name, message.request.model_version or None)
