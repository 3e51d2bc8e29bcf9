"""JSON request bodies whose tensor arrays go straight into numpy (pysimdjson), and precise JSON errors.

orjson turns a 3.9 MB body of nested number lists into a million Python
floats, which ``np.array`` then reads back one by one (~12 ms, most of a
large JSON request). simdjson parses the same body into its own tape and
pysimdjson's ``Array.as_buffer(of_type="d")`` copies an array's numbers into a
flat float64 buffer without creating one Python object
(https://pysimdjson.tkte.ch/, "as_buffer"). So a large body is parsed with
simdjson, everything but the tensor arrays is converted to Python as orjson
would, and each tensor array stays a :class:`JsonArray` until
:mod:`service.http.codecs.tensors` decodes it.

``as_buffer`` flattens recursively and says nothing of the nesting: it
gives ``[1, 2, 3]`` for ``[[1, 2], [3]]`` and for ``[[1, [2]], 3]``, and fails
on booleans, strings and null alike. So the fast path also checks the shape:
every array at each level has the length of the first one
(:func:`_rectangular_shape`, one Python step per inner array, not per number),
and the body holds no array beyond those (``[`` counted in the raw bytes;
bodies with backslash escapes skip that shortcut). Anything the fast path
does not accept is read with ``as_list`` and decoded by the precise path,
whose messages name the field, the index and the cause.

Small bodies (below :data:`SIMDJSON_MIN_BYTES`) are parsed by orjson, which is
faster there; both parsers give the same values.

When orjson refuses a body, :func:`json_error` explains why in the service's
words where it can: a literal ``NaN`` or ``Infinity`` (JSON has neither) or
a number beyond float64 is located by re-reading the body with the standard
library's parser, whose hooks see those tokens, and named by its path.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import orjson
import simdjson

SIMDJSON_MIN_BYTES = 32 << 10
"""Bodies of at least this size are parsed with simdjson (below it orjson is as fast and simpler)."""

LOCATE_MAX_BYTES = 8 << 20
"""Largest body re-read by the standard library's parser to locate a NaN or an overflowing number."""

Path = tuple[str | int, ...]


class JsonArray:
    """A JSON array of the body, still in simdjson's tape: decoded by :mod:`service.http.codecs.tensors`.

    ``shape`` is the nested shape when every level is rectangular and no
    array sits where a number should (checked when the body was parsed),
    else None; :meth:`as_float64` is then never taken and the precise path
    reads :meth:`to_python`.
    """

    __slots__ = ("_array", "shape")

    def __init__(self, array: simdjson.Array, shape: tuple[int, ...] | None) -> None:
        self._array = array
        self.shape = shape

    def __len__(self) -> int:
        return len(self._array)

    def __repr__(self) -> str:
        return f"JsonArray(shape={self.shape})"

    def lead_dims(self) -> tuple[int, ...]:
        """The lengths along the first elements: one proxy per level, whatever the array holds."""
        dims: list[int] = []
        node: Any = self._array
        while isinstance(node, simdjson.Array):
            n = len(node)
            dims.append(n)
            if n == 0:
                break
            node = node[0]
        return tuple(dims)

    def to_python(self) -> list[Any]:
        """The array as Python lists, numbers and booleans (what orjson would have given)."""
        return self._array.as_list()

    def as_float64(self) -> np.ndarray | None:
        """The numbers as a float64 array of :attr:`shape`, or None if it holds anything but numbers."""
        if self.shape is None:
            return None
        try:
            buffer = self._array.as_buffer(of_type="d")
        except (TypeError, ValueError):  # a boolean, string, null or object; a number simdjson cannot read
            return None
        flat = np.frombuffer(buffer, dtype=np.float64)
        if flat.size != math.prod(self.shape):
            return None
        return flat.reshape(self.shape)


def _rectangular_shape(array: simdjson.Array) -> tuple[tuple[int, ...], int] | None:
    """The nested shape of ``array`` and its number of arrays, or None when a level is ragged.

    The shape follows the first element down; then every array of each level
    must have that level's length and hold only arrays (but the last level).
    Arrays inside last-level arrays are not seen here: the caller counts them.
    """
    dims: list[int] = []
    node: Any = array
    while isinstance(node, simdjson.Array):
        n = len(node)
        dims.append(n)
        if n == 0:
            break
        node = node[0]
    level: list[Any] = [array]
    arrays = 1
    for depth in range(len(dims) - 1):
        size = dims[depth]
        children: list[Any] = []
        for a in level:
            if len(a) != size:
                return None
            children.extend(a)
        if not all(type(c) is simdjson.Array for c in children):
            return None
        arrays += len(children)
        level = children
    last = dims[-1]
    for a in level:
        if len(a) != last:
            return None
    return tuple(dims), arrays


def _brackets(value: Any) -> int:
    """``[`` characters that ``value`` (converted from the body) accounts for: its arrays and its strings' brackets."""
    if isinstance(value, list):
        return 1 + sum(_brackets(v) for v in value)
    if isinstance(value, dict):
        return sum(k.count("[") + _brackets(v) for k, v in value.items())
    if isinstance(value, str):
        return value.count("[")
    return 0


class _Lazy:
    """Collects the tensor arrays of one body while it is converted, for the final bracket count."""

    def __init__(self) -> None:
        self.arrays: list[JsonArray] = []
        self.expected = 0
        self.ok = True

    def wrap(self, value: Any) -> Any:
        if not isinstance(value, simdjson.Array):
            return _to_python(value)
        found = _rectangular_shape(value)
        if found is None:
            self.ok = False
            out = JsonArray(value, None)
        else:
            out = JsonArray(value, found[0])
            self.expected += found[1]
        self.arrays.append(out)
        return out

    def verify(self, body: bytes, rest: int) -> None:
        """Keep the shapes only if the body has no ``[`` beyond the counted arrays (no array hides in a tensor).

        Without backslashes in the body every string reads as it is written, so
        the brackets of the converted strings and keys are those of the body.
        """
        counted = self.expected + rest
        clean = self.ok and body.find(b"\\") < 0
        if clean and int(np.count_nonzero(np.frombuffer(body, dtype=np.uint8) == ord("["))) == counted:
            return
        for a in self.arrays:
            a.shape = None


def _to_python(value: Any) -> Any:
    if isinstance(value, simdjson.Array):
        return value.as_list()
    if isinstance(value, simdjson.Object):
        return value.as_dict()
    return value


def _parse_simdjson(body: bytes) -> Any:
    """The document's root (a simdjson proxy), or None when simdjson refuses it (orjson then decides)."""
    try:
        return simdjson.Parser().parse(body)  # a parser per body: a proxy pins its parser's document
    except (ValueError, RuntimeError, TypeError):
        return None


def _loads(body: bytes, on_error: Callable[[orjson.JSONDecodeError], Exception]) -> Any:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise on_error(exc) from None


class _Duplicate(Exception):
    """An object with a repeated key: orjson (the last value wins) reads the body instead."""


def _items(obj: simdjson.Object) -> list[tuple[str, Any]]:
    """The (key, proxy) pairs of an object (``items()`` would convert every value to Python)."""
    keys = list(obj.keys())
    if len(set(keys)) != len(keys):
        raise _Duplicate
    return [(k, obj[k]) for k in keys]


def _convert_object(obj: simdjson.Object, lazy: _Lazy) -> tuple[dict[str, Any], int]:
    """An object whose ``data`` stays lazy (a tensor in object form, an inference input); and its brackets."""
    out: dict[str, Any] = {}
    brackets = 0
    for k, v in _items(obj):
        brackets += k.count("[")
        if k == "data":
            out[k] = lazy.wrap(v)
        else:
            out[k] = _to_python(v)
            brackets += _brackets(out[k])
    return out, brackets


Converted = tuple[Any, int]
"""A top-level value as Python (tensor arrays left lazy) and the ``[`` characters of the body it accounts for."""


def _plain(value: Any) -> Converted:
    converted = _to_python(value)
    return converted, _brackets(converted)


def _parse_lazily(
    body: bytes,
    on_error: Callable[[orjson.JSONDecodeError], Exception],
    convert: Callable[[str, Any, _Lazy], Converted],
) -> Any:
    """A large body parsed by simdjson, each top-level ``(key, value)`` converted by ``convert``; what orjson
    gives when simdjson refuses the body, its root is not an object, or a key is repeated.
    """
    root = _parse_simdjson(body)
    if not isinstance(root, simdjson.Object):
        return _loads(body, on_error)
    lazy = _Lazy()
    out: dict[str, Any] = {}
    rest = 0
    try:
        for key, value in _items(root):
            out[key], brackets = convert(key, value, lazy)
            rest += key.count("[") + brackets
    except _Duplicate:
        return _loads(body, on_error)
    if lazy.arrays:
        lazy.verify(body, rest)
    return out


def parse_object(
    body: bytes,
    tensor_fields: Iterable[str],
    on_error: Callable[[orjson.JSONDecodeError], Exception],
) -> Any:
    """Parse a /v1-style body; the top-level ``tensor_fields`` (nested, or the ``data`` of the object form) stay
    :class:`JsonArray` when the body is large. Returns what orjson would (any JSON value) otherwise.
    """
    wanted = frozenset(tensor_fields)
    if len(body) < SIMDJSON_MIN_BYTES or not wanted:
        return _loads(body, on_error)

    def convert(key: str, value: Any, lazy: _Lazy) -> Converted:
        if key not in wanted:
            return _plain(value)
        if isinstance(value, simdjson.Object):
            return _convert_object(value, lazy)
        return lazy.wrap(value), 0

    return _parse_lazily(body, on_error, convert)


def parse_infer_request(body: bytes, on_error: Callable[[orjson.JSONDecodeError], Exception]) -> Any:
    """Parse an inference request (Open Inference Protocol); ``inputs[i].data`` stay :class:`JsonArray` when large."""
    if len(body) < SIMDJSON_MIN_BYTES:
        return _loads(body, on_error)

    def convert(key: str, value: Any, lazy: _Lazy) -> Converted:
        if key != "inputs" or not isinstance(value, simdjson.Array):
            return _plain(value)
        inputs: list[Any] = []
        brackets = 1
        for item in value:
            spec, item_brackets = _convert_object(item, lazy) if isinstance(item, simdjson.Object) else _plain(item)
            inputs.append(spec)
            brackets += item_brackets
        return inputs, brackets

    return _parse_lazily(body, on_error, convert)


# --------------------------------------------------------------------------- precise JSON errors


class _Constant:
    """A token JSON does not have (NaN, Infinity) or a number beyond float64, met while re-reading a body."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


def _constant(text: str) -> _Constant:
    return _Constant(text)


def _float(text: str) -> float | _Constant:
    value = float(text)
    return _Constant(text) if math.isinf(value) else value


FLOAT64_MAX_DIGITS = 309
"""An integer of more digits than this is beyond float64 (its largest value has 309)."""


def _int(text: str) -> int | _Constant:
    """An integer token; one beyond float64 (orjson reads integers as doubles past 64 bits) is located like a float,
    without converting its digits (Python refuses more than 4300).
    """
    if len(text.lstrip("-")) > FLOAT64_MAX_DIGITS:
        return _Constant(text)
    value = int(text)
    try:
        float(value)
    except OverflowError:
        return _Constant(text)
    return value


def _find_constant(value: Any, path: Path = ()) -> tuple[Path, _Constant] | None:
    """The first :class:`_Constant` in document order, with its path."""
    stack: list[tuple[Path, Any]] = [(path, value)]
    while stack:
        where, v = stack.pop()
        if isinstance(v, _Constant):
            return where, v
        if isinstance(v, dict):
            stack.extend(reversed([((*where, k), x) for k, x in v.items()]))
        elif isinstance(v, list):
            stack.extend(reversed([((*where, i), x) for i, x in enumerate(v)]))
    return None


_SUSPECTS = (b"NaN", b"Infinity", b"-Infinity", b"+")


def locate_bad_number(body: bytes, exc: orjson.JSONDecodeError) -> tuple[Path, str, Any] | None:
    """Where orjson stopped, if it stopped at ``NaN``, ``Infinity`` or a number beyond float64.

    Returns (path, the token's text, the document as the standard library read it).

    The body is re-read by the standard library's parser, which accepts those
    tokens through its hooks; None when it is not such a token, the body is
    too large to re-read (:data:`LOCATE_MAX_BYTES`), or the token cannot be located.
    """
    data = bytes(body)
    pos = exc.pos
    start = pos - 1 if pos > 0 and data[pos - 1 : pos] in (b"-", b"+") else pos
    head = data[start : start + 12]
    numeric = head[:1].isdigit() or (head[:1] in (b"-", b"+") and head[1:2].isdigit())
    if not (numeric or any(head.startswith(s) for s in _SUSPECTS[:3])) or len(data) > LOCATE_MAX_BYTES:
        return None
    try:
        value = json.loads(data, parse_constant=_constant, parse_float=_float, parse_int=_int)
    except (ValueError, RecursionError):
        return None
    found = _find_constant(value)
    return None if found is None else (found[0], found[1].text, value)


SHOWN_DIGITS = 24
"""A long number is shown by its first digits and its length."""


def describe_bad_number(text: str) -> str:
    """Why a located token is refused, in the service's words."""
    if text in ("NaN", "Infinity", "-Infinity"):
        return f"is {text}, which JSON does not have (and values must be finite numbers)"
    shown = text if len(text) <= SHOWN_DIGITS + 8 else f"{text[:SHOWN_DIGITS]}... ({len(text)} characters)"
    return f"= {shown} is beyond the range of float64 (values must be finite numbers)"


def format_path(path: Path) -> str:
    """``("query", 0, 1)`` as ``query[0, 1]``, ``("query", "data", 3)`` as ``query.data[3]``."""
    out = ""
    index: list[str] = []
    for part in path:
        if isinstance(part, int):
            index.append(str(part))
            continue
        if index:
            out += f"[{', '.join(index)}]"
            index = []
        out += f".{part}" if out else str(part)
    if index:
        out += f"[{', '.join(index)}]"
    return out or "the body"
