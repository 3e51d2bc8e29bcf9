"""The /v1 wire forms of a tensor, to and from numpy arrays (the contract's "Tensors on the wire").

Three forms are accepted: a nested JSON array; ``{"shape", "dtype", "data"}``
with flat C-order data; ``{"shape", "dtype", "b64"}`` with the base64 of the
little-endian C-order bytes. The flat and base64 forms are checked against the
size limits from their declared shape before any data is converted.
"""

from __future__ import annotations

import binascii
import math
from typing import Any, Literal

import numpy as np
import pybase64  # SIMD base64, ~40x faster than the standard library on large tensors

from service.core.errors import InvalidInput
from service.dataplane.tensors import TensorLimits, check_shape, first_non_finite, index_text
from service.http.codecs.jsonbody import JsonArray
from service.http.codecs.nested_lists import Expect, ambiguous_integer_mask, find_problem, numbers_only

WIRE_DTYPES: dict[str, np.dtype] = {
    "float32": np.dtype("<f4"),
    "float64": np.dtype("<f8"),
    "float16": np.dtype("<f2"),
    "bool": np.dtype("bool"),
}

TensorKind = Literal["float", "mask", "logits"]
"""float: rank >= 2 numbers; mask: numbers or booleans, rank >= 1; logits: numbers, rank >= 1."""

_MIN_RANK: dict[str, int] = {"float": 2, "mask": 1, "logits": 1}
DEFAULT_LIMITS = TensorLimits()


def _declared_shape(value: dict[str, Any], name: str) -> tuple[int, ...]:
    shape = value.get("shape")
    if not isinstance(shape, list) or not all(type(s) is int for s in shape):
        raise InvalidInput(f"{name}.shape must be a list of integers", (name, "shape"))
    return tuple(shape)


def _expect(kind: TensorKind) -> Expect:
    return "numbers or booleans" if kind == "mask" else "numbers"


def _problem(value: list[Any], name: str, kind: TensorKind, label: str, loc: tuple[str | int, ...]) -> InvalidInput:
    """The precise error for lists that numpy could not take as they are."""
    found = find_problem(value, label, _expect(kind))
    if found is None:  # numbers numpy cannot hold, e.g. an integer beyond 64 bits from the standard library's parser
        return InvalidInput(f"{label} holds a number out of range for a float64 array", (*loc,))
    return InvalidInput(found.message, (*loc, *found.index))


def _from_lists(value: list[Any], name: str, kind: TensorKind, label: str, loc: tuple[str | int, ...]) -> np.ndarray:
    """Nested Python lists as an array: one ``np.array`` call, and the precise walk only when it is not clean."""
    try:
        arr = np.array(value)
    except (ValueError, TypeError, OverflowError):
        raise _problem(value, name, kind, label, loc) from None
    if arr.dtype.kind == "b":
        if kind != "mask":
            raise _problem(value, name, kind, label, loc)
        return arr
    if arr.dtype.kind not in "iuf" or (kind != "mask" and not numbers_only(value)):
        raise _problem(value, name, kind, label, loc)
    if kind == "mask":
        mixed = find_problem(value, label, "numbers or booleans")  # bools and numbers give a numeric array
        if mixed is not None:
            raise InvalidInput(mixed.message, (*loc, *mixed.index))
        ambiguous = ambiguous_integer_mask(arr, label)
        if ambiguous is not None:
            raise InvalidInput(ambiguous, loc)
    return arr


def _from_json_array(
    value: JsonArray, name: str, kind: TensorKind, label: str, loc: tuple[str | int, ...]
) -> np.ndarray:
    """A :class:`JsonArray` (its leading dimensions already within the limits): its float64 buffer when it is a
    rectangular array of numbers, a boolean mask from its bytes, else the first problem, read from its bytes in the
    precise path's words; no Python object per element either way.
    """
    structure = value.structure()
    if kind == "mask" and structure.only_booleans:
        flags = value.as_bool()
        if flags is not None:
            return flags
    arr = value.as_float64()
    if arr is not None:
        if kind == "mask" and not structure.fractions:  # integers only: 0 and 1 alone are ambiguous
            ambiguous = ambiguous_integer_mask(arr.astype(np.int64), label)
            if ambiguous is not None:
                raise InvalidInput(ambiguous, loc)
        return arr
    found = value.problem(label, _expect(kind))
    if found is not None:
        raise InvalidInput(found.message, (*loc, *found.index))
    # A rectangular array of numbers that simdjson cannot give as doubles: the Python path (rare, and the leading
    # dimensions were checked against the limits).
    return _from_lists(value.to_python(), name, kind, label, loc)


def lead_dims(value: list[Any]) -> tuple[int, ...]:
    """The lengths along the first elements (``[[1, 2], [3]]``: (2, 2)): the shape, if the lists are rectangular."""
    dims: list[int] = []
    node: Any = value
    while isinstance(node, list):
        dims.append(len(node))
        if not node:
            break
        node = node[0]
    return tuple(dims)


def refuse_impossible(lead: tuple[int, ...], name: str, limits: TensorLimits, min_rank: int, *, sizes: bool) -> None:
    """Refuse at once, from the lengths along the first elements, what no rectangular array within the limits can
    be: nested deeper than the largest rank (numpy stops at 64 dimensions, which was reported as a number out of
    range), and with ``sizes`` a dimension or an element count over its limit (the message names the axis).
    """
    over = len(lead) > limits.max_rank
    if sizes and not over:
        over = any(d > limits.max_dim for d in lead) or math.prod(lead) > limits.max_elements
    if over:
        check_shape(lead, name, limits, min_rank)


def _from_nested(value: list[Any] | JsonArray, name: str, kind: TensorKind, limits: TensorLimits) -> np.ndarray:
    if isinstance(value, JsonArray):  # its buffer takes at most 4 times the body's bytes: no limit check first
        refuse_impossible(value.lead_dims(), name, limits, _MIN_RANK[kind], sizes=True)
        arr = _from_json_array(value, name, kind, name, (name,))
    else:
        refuse_impossible(lead_dims(value), name, limits, _MIN_RANK[kind], sizes=False)
        arr = _from_lists(value, name, kind, name, (name,))
    check_shape(arr.shape, name, limits, _MIN_RANK[kind])
    return arr


def _from_flat_data(
    data: Any, name: str, kind: TensorKind, dtype: np.dtype, dtype_name: str, shape: tuple[int, ...]
) -> np.ndarray:
    """The ``data`` of the object form: a flat list of ``prod(shape)`` values of the declared dtype."""
    label, loc = f"{name}.data", (name, "data")
    if not isinstance(data, list | JsonArray):
        raise InvalidInput(f"{label} must be a flat list", loc)
    count = math.prod(shape)
    if len(data) != count:
        raise InvalidInput(f"{label} has {len(data)} values but shape {list(shape)} needs {count}", loc)
    if dtype == np.bool_ and isinstance(data, JsonArray):  # read from its bytes
        flags = data.as_bool()
        if flags is not None and flags.ndim == 1:
            return flags.reshape(shape)
        found = data.problem(label, "booleans")
        if found is not None:
            raise InvalidInput(f"{found.message} (dtype bool)", (*loc, *found.index))
        raise InvalidInput(f"{label} must hold booleans for dtype bool", loc)
    if dtype == np.bool_ and isinstance(data, list):
        items = data
        try:
            flat = np.array(items)
        except (ValueError, TypeError, OverflowError):
            flat = np.array([None])
        if flat.ndim != 1 or flat.dtype != bool:
            found = find_problem(items, label, "booleans")
            if found is None:  # pragma: no cover - np.array gives bool for flat lists of booleans
                raise InvalidInput(f"{label} must hold booleans for dtype bool", loc)
            raise InvalidInput(f"{found.message} (dtype bool)", (*loc, *found.index))
        return flat.reshape(shape)
    if isinstance(data, JsonArray):
        fast = data.as_float64()
        if fast is None:
            found = data.problem(label, "numbers")
            if found is not None:
                raise InvalidInput(found.message, (*loc, *found.index))
        flat = fast if fast is not None else _from_lists(data.to_python(), name, "float", label, loc)
    else:
        flat = _from_lists(data, name, "float", label, loc)
    if flat.ndim != 1:
        raise InvalidInput(f"{label} must be a flat list of numbers, not nested lists", loc)
    with np.errstate(over="ignore"):
        arr = flat.astype(dtype).reshape(shape)
    if dtype != flat.dtype:
        idx = first_non_finite(arr)
        if idx is not None:
            source = flat[int(np.ravel_multi_index(idx, shape))]
            larger = " or ".join(d for d in ("float32", "float64") if np.dtype(d).itemsize > dtype.itemsize)
            raise InvalidInput(
                f"{name}{index_text(idx)} = {source} overflows {dtype_name}, the declared dtype (largest "
                f"{float(np.finfo(dtype).max):g}); declare dtype {larger}",
                (name, *idx),
            )
    return arr


def _from_object(value: dict[str, Any], name: str, kind: TensorKind, limits: TensorLimits) -> np.ndarray:
    unknown = set(value) - {"shape", "dtype", "data", "b64"}
    if unknown:
        raise InvalidInput(f"{name} has unknown fields {sorted(unknown)}", (name,))
    dtype_name = value.get("dtype")
    if not isinstance(dtype_name, str) or dtype_name not in WIRE_DTYPES:  # a list or object is unhashable
        raise InvalidInput(f"{name}.dtype must be one of {', '.join(WIRE_DTYPES)}; got {dtype_name!r}", (name, "dtype"))
    dtype = WIRE_DTYPES[dtype_name]
    shape = _declared_shape(value, name)
    check_shape(shape, name, limits, _MIN_RANK[kind])
    count = math.prod(shape)
    has_data, has_b64 = "data" in value, "b64" in value
    if has_data == has_b64:
        raise InvalidInput(f"{name} needs exactly one of 'data' (flat list) or 'b64'", (name,))
    if has_b64:
        text = value["b64"]
        if not isinstance(text, str):
            raise InvalidInput(f"{name}.b64 must be a base64 string", (name, "b64"))
        expected = count * dtype.itemsize
        if len(text) > 4 * ((expected + 2) // 3) + 4:
            raise InvalidInput(f"{name}.b64 is longer than shape {list(shape)} of {dtype_name} needs", (name, "b64"))
        try:
            raw = pybase64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            raise InvalidInput(f"{name}.b64 is not valid base64", (name, "b64")) from None
        if len(raw) != expected:
            raise InvalidInput(
                f"{name}.b64 decodes to {len(raw)} bytes but shape {list(shape)} of {dtype_name} needs {expected}",
                (name, "b64"),
            )
        if dtype == np.bool_:
            ints = np.frombuffer(raw, dtype=np.uint8)
            if (ints > 1).any():
                raise InvalidInput(f"{name}.b64: bool bytes must be 0 or 1", (name, "b64"))
            arr = ints.view(bool).reshape(shape)
        else:
            arr = np.frombuffer(raw, dtype=dtype).reshape(shape)
    else:
        arr = _from_flat_data(value["data"], name, kind, dtype, dtype_name, shape)
    if kind != "mask" and arr.dtype == bool:
        raise InvalidInput(f"{name} must have a floating dtype, not bool", (name, "dtype"))
    return arr


def decode_tensor(
    value: Any, name: str, *, kind: TensorKind = "float", limits: TensorLimits = DEFAULT_LIMITS
) -> np.ndarray:
    """Decode one wire tensor into a numpy array, raising :class:`InvalidInput` with its location."""
    if isinstance(value, list | JsonArray):
        arr = _from_nested(value, name, kind, limits)
    elif isinstance(value, dict):
        arr = _from_object(value, name, kind, limits)
    else:
        raise InvalidInput(f"{name} must be a nested array or an object with shape, dtype and data or b64", (name,))
    return arr


def encode_b64(arr: np.ndarray) -> dict[str, Any]:
    """The ``b64`` wire form of an array (little-endian, C order)."""
    a = np.ascontiguousarray(arr)
    if a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("<"))
    name = "bool" if a.dtype == bool else a.dtype.name
    return {"shape": list(a.shape), "dtype": name, "b64": pybase64.b64encode(a.tobytes()).decode("ascii")}


def encode_tensor(arr: np.ndarray, encoding: str) -> Any:
    """A response tensor: the array itself (serialized by orjson as nested lists) or its b64 form."""
    if encoding == "base64":
        return encode_b64(arr)
    return np.ascontiguousarray(arr)
