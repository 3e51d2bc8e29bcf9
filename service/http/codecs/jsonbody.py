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
on booleans, strings and null alike. So a :class:`JsonArray`'s structure (its
shape when rectangular, the kinds of its values, and otherwise the first
problem in the words of the precise path) is read from its minified bytes by
:mod:`service.http.codecs.jsonscan`, with numpy, when it is decoded and after
its leading dimensions passed the limits: nothing here creates a Python object
per element or per inner list (an array of three million empty lists, 8.6 MB,
took 1.1 s of the interpreter's lock and 350-750 MB as Python lists when it was
walked at parse time).

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
from typing import Any, Literal

import numpy as np
import orjson
import simdjson

from service.core.errors import InvalidInput
from service.http.codecs import jsonscan
from service.http.codecs.problems import ArrayProblem, Expect

SIMDJSON_MIN_BYTES = 32 << 10
"""Bodies of at least this size are parsed with simdjson (below it orjson is as fast and simpler)."""

LOCATE_MAX_BYTES = 8 << 20
"""Largest body re-read by the standard library's parser to locate a NaN or an overflowing number."""

Path = tuple[str | int, ...]


class JsonArray:
    """A JSON array of the body, still in simdjson's tape: decoded by :mod:`service.http.codecs.tensors`.

    Its structure is read from its bytes on first use (:meth:`structure`); :attr:`shape` is the nested shape
    when the array is rectangular, else None.
    """

    __slots__ = ("_array", "_structure")

    def __init__(self, array: simdjson.Array) -> None:
        self._array = array
        self._structure: jsonscan.Structure | None = None

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

    def _mini(self) -> bytes:
        """The array's minified JSON text (simdjson's own minifier, from the tape: no Python object per value)."""
        mini: Any = self._array.mini  # bytes at run time; pysimdjson's stubs say str
        return mini if isinstance(mini, bytes) else mini.encode()

    def structure(self) -> jsonscan.Structure:
        """The array's shape when rectangular and the kinds of its values (:meth:`jsonscan.Analysis.structure`)."""
        if self._structure is None:
            self._structure = jsonscan.Analysis(self._mini()).structure()
        return self._structure

    @property
    def shape(self) -> tuple[int, ...] | None:
        return self.structure().shape

    def problem(self, label: str, expect: Expect) -> ArrayProblem | None:
        """Why the array is not a rectangular array of ``expect``, as the precise path says it (None: it is one)."""
        return jsonscan.Analysis(self._mini()).problem(label, expect)

    def to_python(self) -> list[Any]:
        """The array as Python lists, numbers and booleans (what orjson would have given)."""
        return self._array.as_list()

    def _buffer(self, of_type: Literal["d", "i"], dtype: type[np.generic]) -> np.ndarray | None:
        structure = self.structure()
        if structure.shape is None or not structure.only_numbers:
            return None
        try:
            buffer = self._array.as_buffer(of_type=of_type)
        except (TypeError, ValueError):  # a number simdjson cannot give as that type
            return None
        flat = np.frombuffer(buffer, dtype=dtype)
        if flat.size != math.prod(structure.shape):
            return None
        return flat.reshape(structure.shape)

    def as_float64(self) -> np.ndarray | None:
        """The numbers as a float64 array of :attr:`shape`, or None if it holds anything but numbers."""
        return self._buffer("d", np.float64)

    def as_int64(self) -> np.ndarray | None:
        """The numbers as an int64 array of :attr:`shape`, or None unless they are all integers an int64 holds."""
        return None if self.structure().fractions else self._buffer("i", np.int64)

    def as_bool(self) -> np.ndarray | None:
        """The values as a boolean array of :attr:`shape`, or None unless they are all booleans."""
        structure = self.structure()
        if structure.shape is None or not structure.only_booleans:
            return None
        return jsonscan.booleans(self._mini(), structure.shape)


def _lazy(value: Any) -> Any:
    """A tensor array left in the tape; any other value converted to Python."""
    return JsonArray(value) if isinstance(value, simdjson.Array) else _to_python(value)


def _to_python(value: Any) -> Any:
    if isinstance(value, simdjson.Array):
        return value.as_list()
    if isinstance(value, simdjson.Object):
        return value.as_dict()
    return value


MAX_CONTAINERS = (1 << 20) + 1
"""Arrays and objects in one field that is not a tensor (the longest legitimate one, ``previous_tokens``, has a
list per row of logits, at most ``ATTN_MAX_VOCAB`` of them, by default 2**20): more is refused before any is built."""


MAX_INPUTS = 64
"""More inputs than any model has (six at most): refused before they are converted."""


def _field(key: str, value: Any) -> Any:
    """A field that is not a tensor, converted to Python once its arrays and objects are counted (in its bytes)."""
    if isinstance(value, simdjson.Array | simdjson.Object):
        mini: Any = value.mini  # bytes at run time; pysimdjson's stubs say str
        text = mini if isinstance(mini, bytes) else mini.encode()
        containers = text.count(b"[") + text.count(b"{")  # an upper bound: strings may hold brackets too
        if containers > MAX_CONTAINERS:
            raise InvalidInput(
                f"{key} holds {containers} arrays or objects, more than any field that is not a tensor may "
                f"({MAX_CONTAINERS})",
                (key,),
            )
    return _to_python(value)


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


def _convert_object(obj: simdjson.Object) -> dict[str, Any]:
    """An object whose ``data`` stays lazy (a tensor in object form, an inference input)."""
    return {k: _lazy(v) if k == "data" else _field(k, v) for k, v in _items(obj)}


def _parse_lazily(
    body: bytes, on_error: Callable[[orjson.JSONDecodeError], Exception], convert: Callable[[str, Any], Any]
) -> Any:
    """A large body parsed by simdjson, each top-level ``(key, value)`` converted by ``convert``; what orjson
    gives when simdjson refuses the body, its root is not an object, or a key is repeated.
    """
    root = _parse_simdjson(body)
    if not isinstance(root, simdjson.Object):
        return _loads(body, on_error)
    try:
        return {key: convert(key, value) for key, value in _items(root)}
    except _Duplicate:
        return _loads(body, on_error)


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

    def convert(key: str, value: Any) -> Any:
        if key not in wanted:
            return _field(key, value)
        if isinstance(value, simdjson.Object):
            return _convert_object(value)
        return _lazy(value)

    return _parse_lazily(body, on_error, convert)


def parse_infer_request(body: bytes, on_error: Callable[[orjson.JSONDecodeError], Exception]) -> Any:
    """Parse an inference request (Open Inference Protocol); ``inputs[i].data`` stay :class:`JsonArray` when large."""
    if len(body) < SIMDJSON_MIN_BYTES:
        return _loads(body, on_error)

    def convert(key: str, value: Any) -> Any:
        if key != "inputs" or not isinstance(value, simdjson.Array):
            return _field(key, value)
        if len(value) > MAX_INPUTS:
            raise InvalidInput(f"inputs has {len(value)} entries; a model takes at most {MAX_INPUTS}", ("inputs",))
        return [_convert_object(item) if isinstance(item, simdjson.Object) else _field(key, item) for item in value]

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
