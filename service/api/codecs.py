"""Codecs between the wire forms of a tensor and numpy arrays (api.md, "Tensors on the wire").

Three forms are accepted: a nested JSON array; ``{"shape", "dtype", "data"}``
with flat C-order data; ``{"shape", "dtype", "b64"}`` with the base64 of the
little-endian C-order bytes. The flat and base64 forms are checked against the
size limits from their declared shape before any data is converted.
"""

from __future__ import annotations

import binascii
import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pybase64  # SIMD base64, ~40x faster than the standard library on large tensors

from service.core.errors import InvalidInput

WIRE_DTYPES: dict[str, np.dtype] = {
    "float32": np.dtype("<f4"),
    "float64": np.dtype("<f8"),
    "float16": np.dtype("<f2"),
    "bool": np.dtype("bool"),
}

TensorKind = Literal["float", "mask", "logits"]
"""float: rank >= 2 numbers; mask: numbers or booleans, rank >= 1; logits: numbers, rank >= 1."""

_MIN_RANK: dict[str, int] = {"float": 2, "mask": 1, "logits": 1}


@dataclass(frozen=True, slots=True)
class TensorLimits:
    """Size limits applied while decoding (422 past them)."""

    max_rank: int = 4
    max_dim: int = 16384
    max_elements: int = 1 << 24


def _check_shape(shape: tuple[int, ...], name: str, limits: TensorLimits, min_rank: int) -> None:
    if len(shape) > limits.max_rank or len(shape) < min_rank:
        raise InvalidInput(f"{name} has rank {len(shape)}; ranks {min_rank} to {limits.max_rank} are accepted", (name,))
    for axis, size in enumerate(shape):
        if size < 1:
            raise InvalidInput(
                f"{name} has size {size} at axis {axis}; every dimension must be >= 1", (name, "shape", axis)
            )
        if size > limits.max_dim:
            raise InvalidInput(
                f"{name} has size {size} at axis {axis}, above the limit of {limits.max_dim}", (name, "shape", axis)
            )
    count = math.prod(shape)
    if count > limits.max_elements:
        raise InvalidInput(f"{name} has {count} elements, above the limit of {limits.max_elements}", (name, "shape"))


def _declared_shape(value: dict[str, Any], name: str) -> tuple[int, ...]:
    shape = value.get("shape")
    if not isinstance(shape, list) or not all(type(s) is int for s in shape):
        raise InvalidInput(f"{name}.shape must be a list of integers", (name, "shape"))
    return tuple(shape)


def _check_kind(arr: np.ndarray, name: str, kind: TensorKind) -> np.ndarray:
    if arr.dtype == bool:
        if kind == "mask":
            return arr
        raise InvalidInput(f"{name} must hold numbers, not booleans", (name,))
    if arr.dtype.kind in "iuf":
        return arr
    raise InvalidInput(
        f"{name} must be an array of numbers{' or booleans' if kind == 'mask' else ''} (got {arr.dtype.kind!r} data)",
        (name,),
    )


def first_non_finite(arr: np.ndarray) -> tuple[int, ...] | None:
    """Index of the first NaN or infinity in C order, or None if all are finite."""
    if arr.dtype.kind != "f":
        return None
    bad = ~np.isfinite(arr)
    if not bad.any():
        return None
    flat = int(np.argmax(bad.reshape(-1)))
    return tuple(int(i) for i in np.unravel_index(flat, arr.shape))


def _from_nested(value: list[Any], name: str, kind: TensorKind, limits: TensorLimits) -> np.ndarray:
    try:
        arr = np.array(value)
    except (ValueError, TypeError, OverflowError) as exc:
        raise InvalidInput(
            f"{name} is not a rectangular array of numbers: {exc}".split(". The detected")[0], (name,)
        ) from None
    if arr.dtype == object:
        raise InvalidInput(f"{name} is not a rectangular array of numbers (ragged nesting or null values)", (name,))
    _check_shape(arr.shape, name, limits, _MIN_RANK[kind])
    return _check_kind(arr, name, kind)


def _from_object(value: dict[str, Any], name: str, kind: TensorKind, limits: TensorLimits) -> np.ndarray:
    unknown = set(value) - {"shape", "dtype", "data", "b64"}
    if unknown:
        raise InvalidInput(f"{name} has unknown fields {sorted(unknown)}", (name,))
    dtype_name = value.get("dtype")
    if not isinstance(dtype_name, str) or dtype_name not in WIRE_DTYPES:  # a list or object is unhashable
        raise InvalidInput(f"{name}.dtype must be one of {', '.join(WIRE_DTYPES)}; got {dtype_name!r}", (name, "dtype"))
    dtype = WIRE_DTYPES[dtype_name]
    shape = _declared_shape(value, name)
    _check_shape(shape, name, limits, _MIN_RANK[kind])
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
        data = value["data"]
        if not isinstance(data, list):
            raise InvalidInput(f"{name}.data must be a flat list", (name, "data"))
        if len(data) != count:
            raise InvalidInput(
                f"{name}.data has {len(data)} values but shape {list(shape)} needs {count}", (name, "data")
            )
        try:
            flat = np.array(data)
        except (ValueError, TypeError, OverflowError):
            raise InvalidInput(f"{name}.data must be a flat list of numbers", (name, "data")) from None
        if flat.ndim != 1 or flat.dtype == object:
            raise InvalidInput(f"{name}.data must be a flat list of numbers", (name, "data"))
        flat = _check_kind(flat, name, kind)
        if dtype == np.bool_:
            if flat.dtype != bool:
                raise InvalidInput(f"{name}.data must hold booleans for dtype bool", (name, "data"))
            arr = flat.reshape(shape)
        else:
            if flat.dtype == bool:
                raise InvalidInput(f"{name}.data must hold numbers for dtype {dtype_name}", (name, "data"))
            with np.errstate(over="ignore"):
                arr = flat.astype(dtype).reshape(shape)
    if kind != "mask" and arr.dtype == bool:
        raise InvalidInput(f"{name} must have a floating dtype, not bool", (name, "dtype"))
    return arr


def decode_tensor(
    value: Any, name: str, *, kind: TensorKind = "float", limits: TensorLimits = TensorLimits()
) -> np.ndarray:
    """Decode one wire tensor into a numpy array, raising :class:`InvalidInput` with its location."""
    if isinstance(value, list):
        arr = _from_nested(value, name, kind, limits)
    elif isinstance(value, dict):
        arr = _from_object(value, name, kind, limits)
    else:
        raise InvalidInput(f"{name} must be a nested array or an object with shape, dtype and data or b64", (name,))
    return arr


def check_finite(arr: np.ndarray, name: str, *, allow_neg_inf: bool = False) -> None:
    """Reject NaN and infinities, naming the first offending element's index."""
    if arr.dtype.kind != "f":
        return
    probe = arr
    if allow_neg_inf:
        probe = np.where(np.isneginf(arr), 0, arr)
    idx = first_non_finite(probe)
    if idx is not None:
        raise InvalidInput(
            f"{name}[{', '.join(map(str, idx))}] is {arr[idx]}; values must be finite"
            + (" (or -inf)" if allow_neg_inf else ""),
            (name, *idx),
        )


def cast_checked(arr: np.ndarray, dtype: np.dtype, name: str) -> np.ndarray:
    """Cast to the compute dtype, rejecting values the cast turns infinite (float32 overflow)."""
    if arr.dtype == dtype:
        return arr
    with np.errstate(over="ignore"):
        out = np.asarray(arr, dtype=dtype)
    if arr.dtype.kind == "f" or arr.dtype.kind in "iu":
        idx = first_non_finite(out)
        if idx is not None:
            raise InvalidInput(
                f"{name}[{', '.join(map(str, idx))}] = {arr[idx]} overflows {np.dtype(dtype).name}; "
                "use precision float64",
                (name, *idx),
            )
    return out


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
