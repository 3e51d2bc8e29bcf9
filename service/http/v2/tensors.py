"""Tensors of the Open Inference Protocol: JSON ``data`` and the binary tensor data extension.

The binary extension is implemented as Triton and KServe do it
(Triton's ``docs/protocol/extension_binary_data.md``):

- a request or response body is the JSON inference object followed by the raw
  tensors, and the ``Inference-Header-Content-Length`` header gives the length
  of the JSON part (without the header the whole body is JSON);
- an input sent as binary has ``parameters.binary_data_size`` (bytes), and the
  binary inputs follow the JSON in the order the inputs are listed;
- an output is returned as binary when its request has
  ``parameters.binary_data: true``, or when the request's
  ``parameters.binary_data_output`` is true and the output does not say
  otherwise; it then carries ``parameters.binary_data_size``;
- raw tensors are little-endian and row-major, without padding; BOOL is one
  byte (0 or 1).

Binary inputs become numpy arrays over the request body (``np.frombuffer``, no
copy unless the offset leaves them misaligned); JSON ``data`` (flat or nested)
goes through one ``np.array`` call. A response is written once into a single
buffer: the JSON header from orjson (numpy arrays serialized natively),
then each binary output.

Every malformed request raises an ``INVALID`` :class:`~service.dataplane.errors.ServiceError`
(400); nothing a client sends leads to an unhandled exception.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import orjson

from service.dataplane.errors import ServiceError, invalid
from service.dataplane.inference import (
    OUTPUT_DATATYPES,
    InferRequest,
    TensorSpec,
    check_complete,
    check_input_shape,
    check_output,
    input_dtype,
    input_spec,
    output_as_binary,
    refuse_shared_memory,
)
from service.dataplane.tensors import TensorLimits
from service.http.codecs import jsonbody, jsonerrors
from service.http.codecs.nested_lists import Expect, find_problem, numbers_only
from service.http.responses import JSON_OPTIONS, plain
from service.http.v2.checks import check_fits, check_nesting

HEADER_LENGTH = "inference-header-content-length"


def split_body(body: bytes, header_length: str | None) -> tuple[dict[str, Any], memoryview]:
    """The JSON inference object and the binary part after it (empty without the header)."""
    view = memoryview(body)
    if header_length is None:
        n = len(body)
    else:
        digits = header_length.strip(" \t")
        # Plain ASCII digits only: int() would also take "+346", "3_4_6" and non-ASCII digits.
        if not (digits.isascii() and digits.isdigit()):
            raise invalid(
                f"Inference-Header-Content-Length must be an integer written in plain digits, got {header_length!r}"
            )
        n = int(digits)
        if not 0 < n <= len(body):
            raise invalid(f"Inference-Header-Content-Length is {n}, but the body has {len(body)} bytes")
    if n == 0:
        raise invalid("the request body is empty; send an inference request JSON object")
    header = body if n == len(body) else bytes(view[:n])

    def not_json(exc: orjson.JSONDecodeError) -> ServiceError:
        found = jsonerrors.locate_bad_number(header, exc)
        if found is not None:
            path, text, document = found
            where = _json_path(path, document)
            return invalid(f"the inference request is not valid JSON: {where} {jsonerrors.describe_bad_number(text)}")
        hint = " (is Inference-Header-Content-Length right?)" if header_length is not None else ""
        return invalid(
            f"the inference request is not valid JSON{hint}: {jsonerrors.describe_syntax_error(header, exc)}"
        )

    obj = jsonbody.parse_infer_request(header, not_json)
    if not isinstance(obj, dict):
        raise invalid("the inference request must be a JSON object")
    return obj, view[n:]


def _json_path(path: jsonerrors.Path, document: Any) -> str:
    """A path in the inference request, naming an input's data by the input: ``input 'query': data[3]``."""
    if len(path) >= 3 and path[0] == "inputs" and path[2] == "data":
        spec = document["inputs"][path[1]]
        name = spec.get("name") if isinstance(spec, dict) else None
        who = f"input {name!r}" if isinstance(name, str) else f"inputs[{path[1]}]"
        return f"{who}: {jsonerrors.format_path(path[2:])}"
    return jsonerrors.format_path(path)


class BinaryReader:
    """Hands out consecutive slices of the binary part of a body, in input order."""

    def __init__(self, data: memoryview) -> None:
        self.data = data
        self.offset = 0

    def take(self, size: int, name: str) -> memoryview:
        end = self.offset + size
        if end > len(self.data):
            raise invalid(
                f"input {name!r} has binary_data_size {size}, but only {len(self.data) - self.offset} bytes of binary "
                "data remain: the body is truncated, or Inference-Header-Content-Length is wrong"
            )
        out = self.data[self.offset : end]
        self.offset = end
        return out

    def finish(self) -> None:
        left = len(self.data) - self.offset
        if left:
            raise invalid(
                f"{left} bytes follow the inputs' binary data: a binary_data_size or "
                "Inference-Header-Content-Length is wrong"
            )


def _parameters(obj: Mapping[str, Any], where: str) -> dict[str, Any]:
    params = obj.get("parameters", {})
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise invalid(f"{where}.parameters must be an object")
    refuse_shared_memory(params, where)
    return params


def _shape(obj: Mapping[str, Any], name: str) -> tuple[int, ...]:
    shape = obj.get("shape")
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise invalid(f"input {name!r}: shape must be a list of non-negative integers")
    return tuple(shape)


def _from_binary(raw: memoryview, dtype: np.dtype, shape: tuple[int, ...], name: str) -> np.ndarray:
    if dtype.kind == "b":
        ints = np.frombuffer(raw, dtype=np.uint8)
        if (ints > 1).any():
            raise invalid(f"input {name!r}: BOOL bytes must be 0 or 1")
        return ints.view(bool).reshape(shape)
    arr = np.frombuffer(raw, dtype=dtype).reshape(shape)
    # The JSON header has any length, so a tensor may start at an odd offset: copy it aligned.
    return arr if arr.flags.aligned else arr.copy()


_EXPECT: dict[str, Expect] = {"b": "booleans", "i": "integers", "u": "integers", "f": "numbers"}


def _from_json(data: Any, datatype: str, dtype: np.dtype, shape: tuple[int, ...], name: str) -> np.ndarray:
    """JSON ``data`` (flat or nested, row-major) of one input; float data stays float64 until the precision cast."""
    if not isinstance(data, list | jsonbody.JsonArray):
        raise invalid(f"input {name!r}: data must be a JSON array (flat or nested, row-major)")
    count = math.prod(shape)
    if isinstance(data, jsonbody.JsonArray):
        fast = _from_json_array(data, datatype, dtype, shape, name)
        if fast is not None:
            return fast
    items = data.to_python() if isinstance(data, jsonbody.JsonArray) else data
    expect = _EXPECT[dtype.kind]
    try:
        arr = np.array(items)
    except (ValueError, TypeError, OverflowError):
        arr = None
    kinds = {"booleans": "b", "integers": "iu", "numbers": "iuf"}[expect]
    # np.array reads [true, 0.5] as floats: booleans in number data are looked for too (lists come from
    # small bodies or from data the fast path refused, so the walk is short or the request is refused anyway).
    if arr is None or arr.dtype.kind not in kinds or (expect != "booleans" and not numbers_only(items)):
        found = find_problem(items, "data", expect)
        if found is None:
            raise invalid(f"input {name!r}: data is not a rectangular array of {datatype} values")
        if found.ragged:
            raise invalid(f"input {name!r}: data is not a rectangular array of {datatype} values: {found.message}")
        words = {"booleans": "true/false values", "integers": "integers", "numbers": "numbers"}[expect]
        raise invalid(f"input {name!r}: {datatype} data must be {words}: {found.message}")
    assert arr is not None
    if arr.size != count:
        raise invalid(f"input {name!r}: data has {arr.size} values but shape {list(shape)} needs {count}")
    check_nesting(arr.shape, shape, name)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        flat = arr.reshape(-1)
        out_of_range = (flat < info.min) | (flat > info.max) if arr.dtype.kind in "iu" else None
        if arr.dtype == object or (out_of_range is not None and out_of_range.any()):
            i = next(j for j, v in enumerate(flat.tolist()) if not info.min <= v <= info.max)
            raise invalid(
                f"input {name!r}: data[{i}] = {flat.tolist()[i]} is out of range for {datatype} "
                f"({info.min} to {info.max})"
            )
    if dtype.kind == "f" and arr.dtype.kind == "f":
        check_fits(arr, datatype, dtype, name)
        # JSON numbers stay float64 here (the declared datatype holds them); the compute precision casts them.
        return arr.reshape(shape)
    if dtype.kind == "f":
        check_fits(arr, datatype, dtype, name)
    return arr.astype(dtype).reshape(shape)


def _from_json_array(
    data: jsonbody.JsonArray, datatype: str, dtype: np.dtype, shape: tuple[int, ...], name: str
) -> np.ndarray | None:
    """A large body's ``data`` read from its bytes: the array, or the refusal (size, structure or values), without a
    Python object per element; None only for numbers simdjson cannot give in that type (the Python path decides).
    """
    count = math.prod(shape)
    structure = data.structure()
    if dtype.kind == "b":
        fits = structure.only_booleans
    else:
        fits = structure.only_numbers and (dtype.kind == "f" or not structure.fractions)
    if not fits:
        expect = _EXPECT[dtype.kind]
        found = data.problem("data", expect)
        if found is not None:
            if found.ragged:
                raise invalid(f"input {name!r}: data is not a rectangular array of {datatype} values: {found.message}")
            words = {"booleans": "true/false values", "integers": "integers", "numbers": "numbers"}[expect]
            raise invalid(f"input {name!r}: {datatype} data must be {words}: {found.message}")
        return None
    assert structure.shape is not None  # only_numbers and only_booleans imply a rectangular array
    if math.prod(structure.shape) != count:
        raise invalid(
            f"input {name!r}: data has {math.prod(structure.shape)} values but shape {list(shape)} needs {count}"
        )
    check_nesting(structure.shape, shape, name)
    arr = data.as_bool() if dtype.kind == "b" else data.as_float64() if dtype.kind == "f" else data.as_int64()
    if arr is None:
        return None  # numbers simdjson cannot give in that type: the Python path decides
    if dtype.kind == "f":
        check_fits(arr, datatype, dtype, name)
        return arr.reshape(shape)  # float64 until the precision cast, as from lists
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        outside = np.flatnonzero((arr < info.min) | (arr > info.max))
        if len(outside):
            i = int(outside[0])
            raise invalid(
                f"input {name!r}: data[{i}] = {int(arr.reshape(-1)[i])} is out of range for {datatype} "
                f"({info.min} to {info.max})"
            )
    return arr.astype(dtype).reshape(shape)


def parse_request(
    obj: Mapping[str, Any],
    binary: memoryview,
    *,
    model: str,
    inputs: Sequence[TensorSpec],
    outputs: Sequence[str],
    limits: TensorLimits,
) -> InferRequest:
    """Decode the inputs (JSON or binary), check them against the model, and read the requested outputs."""
    request_id = obj.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise invalid("id must be a string")
    params = _parameters(obj, "request")
    specs = {s.name: s for s in inputs}
    raw_inputs = obj.get("inputs")
    if not isinstance(raw_inputs, list) or (not raw_inputs and any(not s.optional for s in inputs)):
        raise invalid("inputs must be a non-empty list of input tensors")  # (a session's end may send none)
    reader = BinaryReader(binary)
    arrays: dict[str, np.ndarray] = {}
    datatypes: dict[str, str] = {}
    for i, raw in enumerate(raw_inputs):
        if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
            raise invalid(f"inputs[{i}] must be an object with a name, shape, datatype and data")
        name = raw["name"]
        spec = input_spec(model, specs, name, arrays)
        datatype = raw.get("datatype")
        dtype = input_dtype(spec, datatype)
        assert isinstance(datatype, str)  # input_dtype took it
        shape = _shape(raw, name)
        check_input_shape(spec, shape, limits)
        in_params = _parameters(raw, f"input {name!r}")
        size = in_params.get("binary_data_size")
        if size is not None:
            if type(size) is not int or size < 0:
                raise invalid(f"input {name!r}: binary_data_size must be a non-negative integer")
            if "data" in raw:
                raise invalid(f"input {name!r} has both data and binary_data_size")
            expected = math.prod(shape) * dtype.itemsize
            if size != expected:
                raise invalid(
                    f"input {name!r}: binary_data_size is {size}, "
                    f"but shape {list(shape)} of {datatype} needs {expected} bytes"
                )
            arrays[name] = _from_binary(reader.take(size, name), dtype, shape, name)
        elif "data" in raw:
            arrays[name] = _from_json(raw["data"], datatype, dtype, shape, name)
        else:
            raise invalid(f"input {name!r} has neither data nor parameters.binary_data_size")
        datatypes[name] = datatype
    reader.finish()
    check_complete(model, inputs, arrays)
    binary_default = params.get("binary_data_output", False)
    if not isinstance(binary_default, bool):
        raise invalid("parameters.binary_data_output must be true or false")
    requested, given = _requested_outputs(obj, binary_default, outputs, model)
    return InferRequest(request_id, params, arrays, datatypes, requested, given, binary_default)


def _requested_outputs(
    obj: Mapping[str, Any], binary_default: bool, known: Sequence[str], model: str
) -> tuple[dict[str, bool], bool]:
    raw_outputs = obj.get("outputs")
    if raw_outputs is None or raw_outputs == []:
        return {}, False
    if not isinstance(raw_outputs, list):
        raise invalid("outputs must be a list of requested outputs")
    requested: dict[str, bool] = {}
    for i, raw in enumerate(raw_outputs):
        if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
            raise invalid(f"outputs[{i}] must be an object with a name")
        name = raw["name"]
        check_output(model, known, requested, name)
        requested[name] = output_as_binary(name, _parameters(raw, f"output {name!r}"), binary_default)
    return requested, True


def encode_response(
    *,
    model: str,
    version: str,
    request_id: str | None,
    parameters: Mapping[str, Any],
    outputs: Sequence[tuple[str, np.ndarray, bool]],
) -> tuple[bytes, dict[str, str], str]:
    """(body, headers, media type) of an inference response.

    ``outputs`` are (name, array, as binary) in response order. JSON outputs carry
    their flat ``data``; binary outputs are appended after the JSON in the same
    order, and ``Inference-Header-Content-Length`` gives the JSON's length.
    """
    described: list[dict[str, Any]] = []
    tail: list[np.ndarray] = []
    for name, arr, binary in outputs:
        datatype = OUTPUT_DATATYPES[arr.dtype]
        flat = np.ascontiguousarray(arr).reshape(-1)
        entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(arr.shape)}
        if binary:
            if flat.dtype.byteorder == ">":
                flat = flat.astype(flat.dtype.newbyteorder("<"))
            entry["parameters"] = {"binary_data_size": flat.nbytes}
            tail.append(flat)
        else:
            entry["data"] = flat
        described.append(entry)
    response: dict[str, Any] = {"model_name": model, "model_version": version}
    if request_id is not None:
        response["id"] = request_id
    if parameters:
        response["parameters"] = parameters
    response["outputs"] = described
    header = orjson.dumps(response, option=JSON_OPTIONS, default=plain)
    if not tail:
        return header, {}, "application/json"
    # One copy of each tensor, straight into the body (join reads the arrays' buffers).
    # ndarray has the buffer protocol; numpy's stubs declare __buffer__ only for Python >= 3.12.
    body = b"".join([header, *tail])  # type: ignore[list-item]
    return body, {"Inference-Header-Content-Length": str(len(header))}, "application/octet-stream"
