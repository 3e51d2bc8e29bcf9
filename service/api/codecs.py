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

from service.api.jsonbody import JsonArray
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


def first_non_finite(arr: np.ndarray) -> tuple[int, ...] | None:
    """Index of the first NaN or infinity in C order, or None if all are finite."""
    if arr.dtype.kind != "f":
        return None
    bad = ~np.isfinite(arr)
    if not bad.any():
        return None
    flat = int(np.argmax(bad.reshape(-1)))
    return tuple(int(i) for i in np.unravel_index(flat, arr.shape))


def _index(index: tuple[int, ...]) -> str:
    return f"[{', '.join(map(str, index))}]"


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, str):
        shown = value if len(value) <= 20 else value[:20] + "..."
        return f"the string {shown!r}"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list"
    return repr(value)


_NON_FINITE_WORDS = frozenset({"nan", "inf", "-inf", "+inf", "infinity", "-infinity", "+infinity"})

Expect = Literal["numbers", "booleans", "numbers or booleans", "integers"]


@dataclass(frozen=True, slots=True)
class ArrayProblem:
    """Why nested lists are not a rectangular array of the expected values: where, and in words."""

    index: tuple[int, ...]
    message: str
    ragged: bool = False


def find_problem(value: list[Any], label: str, expect: Expect) -> ArrayProblem | None:
    """The first reason, in C order, why nested lists are not a rectangular array of ``expect``.

    Returns the index and a message in the service's words (naming
    ``label`` and the index), or None when the lists are fine. The shape is
    the one of the first element at every depth; ``"numbers or booleans"``
    (masks) also refuses a mix of the two.
    """
    dims: list[int] = []
    node: Any = value
    while isinstance(node, list):
        dims.append(len(node))
        if not node:
            break
        node = node[0]
    ndim = len(dims)
    first_kind: tuple[tuple[int, ...], Any] | None = None
    stack: list[tuple[tuple[int, ...], Any]] = [((), value)]
    while stack:
        index, v = stack.pop()
        depth = len(index)
        where = f"{label}{_index(index)}" if index else label
        if depth < ndim:
            if not isinstance(v, list):
                return ArrayProblem(
                    index,
                    (
                        f"{label} is ragged at index {_index(index)}: {where} is {_describe(v)} "
                        f"where a list of {dims[depth]} values is expected (the array must be rectangular)"
                    ),
                    True,
                )
            if len(v) != dims[depth]:
                sibling = f"{label}{_index(index[:-1] + (0,))}" if index else label
                return ArrayProblem(
                    index,
                    (
                        f"{label} is ragged at index {_index(index)}: {where} has {len(v)} "
                        f"value{'s' if len(v) != 1 else ''} where {sibling} has {dims[depth]} "
                        "(the array must be rectangular)"
                    ),
                    True,
                )
            stack.extend(reversed([((*index, i), x) for i, x in enumerate(v)]))
            continue
        if isinstance(v, list):
            return ArrayProblem(
                index,
                (
                    f"{label} is ragged at index {_index(index)}: {where} is a list where a number is expected "
                    "(the array must be rectangular)"
                ),
                True,
            )
        is_bool = isinstance(v, bool)
        is_number = not is_bool and isinstance(v, int | float)
        if expect == "booleans" and not is_bool:
            return ArrayProblem(index, f"{where} must be true or false, got {_describe(v)}")
        if expect == "integers" and isinstance(v, float) and v.is_integer() and abs(v) >= 2.0**63:
            return ArrayProblem(index, f"{where} = {v:.0f} is out of range for a 64-bit integer")
        if expect == "integers" and not (is_number and isinstance(v, int)):
            return ArrayProblem(index, f"{where} must be an integer, got {_describe(v)}")
        if expect == "numbers" and not is_number:
            hint = ""
            if isinstance(v, str) and v.strip().lower() in _NON_FINITE_WORDS:
                hint = " (JSON has no NaN or infinity, and values must be finite numbers)"
            return ArrayProblem(index, f"{where} must be a number, got {_describe(v)}{hint}")
        if expect == "numbers or booleans":
            if not (is_bool or is_number):
                return ArrayProblem(index, f"{where} must be a boolean or a number, got {_describe(v)}")
            if first_kind is None:
                first_kind = (index, v)
            elif isinstance(first_kind[1], bool) != is_bool:
                first = f"{label}{_index(first_kind[0])}"
                return ArrayProblem(
                    index,
                    (
                        f"{label} mixes booleans and numbers ({first} is {_describe(first_kind[1])}, {where} is "
                        f"{_describe(v)}), which is ambiguous: send only booleans (true = may attend) or only "
                        "numbers (added to the scores)"
                    ),
                )
        if is_number and isinstance(v, float) and not math.isfinite(v):  # only from a parser that allows them
            return ArrayProblem(index, f"{where} is {v}; values must be finite")
    return None


def numbers_only(items: list[Any]) -> bool:
    """No boolean among nested lists of numbers (numpy takes true as 1)."""
    stack = [items]
    while stack:
        for x in stack.pop():
            if type(x) is list:
                stack.append(x)
            elif type(x) is bool:
                return False
    return True


def ambiguous_integer_mask(arr: np.ndarray, label: str) -> str | None:
    """Why an integer mask of only 0 and 1 is refused: it reads as booleans and as an additive float mask alike."""
    if arr.dtype.kind not in "iu" or not ((arr == 0) | (arr == 1)).all():
        return None
    return (
        f"{label} holds only the integers 0 and 1, which is ambiguous: send booleans for a boolean mask "
        "(true = may attend) or numbers with a decimal point for an additive float mask (0.0, -1e9)"
    )


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
    """A :class:`JsonArray`: its float64 buffer when it holds only numbers (a mask of only 0 and 1 is looked at
    in Python, where integers and floats differ), else the Python lists and the precise path.
    """
    arr = value.as_float64()
    if arr is not None and not (kind == "mask" and ((arr == 0) | (arr == 1)).all()):
        return arr
    return _from_lists(value.to_python(), name, kind, label, loc)


def _from_nested(value: list[Any] | JsonArray, name: str, kind: TensorKind, limits: TensorLimits) -> np.ndarray:
    if isinstance(value, JsonArray):  # its buffer takes at most 4 times the body's bytes: no limit check first
        arr = _from_json_array(value, name, kind, name, (name,))
    else:
        arr = _from_lists(value, name, kind, name, (name,))
    _check_shape(arr.shape, name, limits, _MIN_RANK[kind])
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
    if dtype == np.bool_:
        items = data.to_python() if isinstance(data, JsonArray) else data
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
        flat = fast if fast is not None and fast.ndim == 1 else _from_lists(data.to_python(), name, "float", label, loc)
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
                f"{name}{_index(idx)} = {source} overflows {dtype_name}, the declared dtype (largest "
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
        arr = _from_flat_data(value["data"], name, kind, dtype, dtype_name, shape)
    if kind != "mask" and arr.dtype == bool:
        raise InvalidInput(f"{name} must have a floating dtype, not bool", (name, "dtype"))
    return arr


def decode_tensor(
    value: Any, name: str, *, kind: TensorKind = "float", limits: TensorLimits = TensorLimits()
) -> np.ndarray:
    """Decode one wire tensor into a numpy array, raising :class:`InvalidInput` with its location."""
    if isinstance(value, list | JsonArray):
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
    """Cast to the compute dtype, rejecting values the cast turns infinite (float32 overflow).

    A value that was already NaN or infinite is named as such (values must be
    finite), not as an overflow; the hint to use float64 is given only where
    it helps, i.e. for a float32 computation of finite float64 input.
    """
    if arr.dtype == dtype:
        return arr
    with np.errstate(over="ignore", invalid="ignore"):
        out = np.asarray(arr, dtype=dtype)
    if arr.dtype.kind in "fiu":
        idx = first_non_finite(out)
        if idx is not None:
            source = arr[idx]
            if arr.dtype.kind == "f" and not np.isfinite(source):
                raise InvalidInput(f"{name}{_index(idx)} is {source}; values must be finite", (name, *idx))
            target = np.dtype(dtype)
            hint = "; use precision float64" if target.itemsize < 8 else ""
            raise InvalidInput(
                f"{name}{_index(idx)} = {source} overflows {target.name} "
                f"(largest {float(np.finfo(target).max):g}){hint}",
                (name, *idx),
            )
    return out


def finite_as(arr: np.ndarray, dtype: np.dtype, name: str) -> np.ndarray:
    """``arr`` in the compute ``dtype`` with every value finite: :func:`cast_checked` and :func:`check_finite`
    in one pass (one check of the result; the index and the cause are looked for only when it fails).
    """
    if arr.dtype == dtype:
        out = arr
    else:
        with np.errstate(over="ignore", invalid="ignore"):
            out = np.asarray(arr, dtype=dtype)
    if out.dtype.kind != "f" or np.isfinite(out).all():
        return out
    cast_checked(arr, dtype, name)  # names a value the cast made infinite, or a NaN/infinity sent as such
    check_finite(out, name)
    raise AssertionError("unreachable: a non-finite value was found above")  # pragma: no cover


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
