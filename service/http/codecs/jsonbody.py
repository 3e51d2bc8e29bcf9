"""JSON request bodies whose tensor arrays go straight into numpy (pysimdjson).

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
per element (an array of three million empty lists, 8.6 MB, took 1.1 s of the
interpreter's lock and 350-750 MB as Python lists when it was walked at parse
time). An ordinary tensor (rectangular, numbers only, at most
:data:`jsonfast.FAST_MAX_ARRAYS` inner lists, no other ``[`` in the body than
accounted for) is confirmed by :mod:`service.http.codecs.jsonfast` instead, at
a fifth of the scan's cost.

Small bodies (below :data:`SIMDJSON_MIN_BYTES`) are parsed by orjson, which is
faster there; both parsers give the same values.

Looking a key up in a simdjson object scans the object, so an object's values are looked up only while it has
no more keys than its reader knows (``fields``): 100,000 keys took 19 s when each was looked up. A /v1 body or
tensor object with more keys is refused (:class:`~service.http.errors.Refused`, naming the first unknown
ones) before any cost grows with their number; an inference request or input with more keeps its known keys only
(the protocol ignores the others).

When orjson refuses a body, :mod:`service.http.codecs.jsonerrors` says why in the
service's words where it can.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Iterator
from itertools import islice
from typing import Any, Literal

import numpy as np
import orjson
import simdjson

from service.core.errors import InvalidInput
from service.dataplane.errors import FieldError
from service.http.codecs import jsonfast, jsonscan
from service.http.codecs.nested_lists import ArrayProblem, Expect
from service.http.errors import Refused

SIMDJSON_MIN_BYTES = 32 << 10
"""Bodies of at least this size are parsed with simdjson (below it orjson is as fast and simpler)."""


class JsonArray:
    """A JSON array of the body, still in simdjson's tape: decoded by :mod:`service.http.codecs.tensors`.

    Its structure is read from its bytes on first use (:meth:`structure`); :attr:`shape` is the nested shape
    when the array is rectangular, else None.
    """

    __slots__ = ("_array", "_fast_shape", "_float64", "_structure", "_walked")

    def __init__(self, array: simdjson.Array) -> None:
        self._array = array
        self._structure: jsonscan.Structure | None = None
        self._walked: tuple[tuple[int, ...], int] | None = None
        self._fast_shape: tuple[int, ...] | None = None
        """Set once the body's brackets confirmed the walked shape (:mod:`service.http.codecs.jsonfast`)."""
        self._float64: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self._array)

    def __repr__(self) -> str:
        return f"JsonArray(shape={self.shape})"

    def lead_dims(self) -> tuple[int, ...]:
        """The lengths along the first elements: one proxy per level, whatever the array holds."""
        return jsonfast.lead_dims(self._array)

    def walked_arrays(self) -> int | None:
        """Its number of lists when it is an ordinary rectangular array (:func:`jsonfast.rectangular_shape`)."""
        self._walked = jsonfast.rectangular_shape(self._array)
        return None if self._walked is None else self._walked[1]

    def confirm_walk(self) -> None:
        """The body's brackets are all accounted for: the walked shape holds (no list hides in a row)."""
        if self._walked is not None:
            self._fast_shape = self._walked[0]

    def _fast_structure(self, shape: tuple[int, ...]) -> jsonscan.Structure | None:
        """Numbers only, in exactly ``shape`` (:func:`jsonfast.numbers_in_shape`); None otherwise."""
        found = jsonfast.numbers_in_shape(self._array, shape)
        if found is None:
            return None
        self._float64, fractions = found
        return jsonscan.Structure(shape, self._float64.size, 0, 0, fractions)

    def _mini(self) -> bytes:
        """The array's minified JSON text (simdjson's own minifier, from the tape: no Python object per value)."""
        mini: Any = self._array.mini  # bytes at run time; pysimdjson's stubs say str
        return mini if isinstance(mini, bytes) else mini.encode()

    def structure(self) -> jsonscan.Structure:
        """The array's shape when rectangular and the kinds of its values (:meth:`jsonscan.Analysis.structure`)."""
        if self._structure is None:
            fast = None if self._fast_shape is None else self._fast_structure(self._fast_shape)
            self._structure = fast if fast is not None else jsonscan.Analysis(self._mini()).structure()
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
        if of_type == "d" and self._float64 is not None:  # read by the quick check already
            return self._float64
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


TENSOR_OBJECT_FIELDS = frozenset({"shape", "dtype", "data", "b64"})
"""The keys of a tensor in object form (/v1)."""
INFER_REQUEST_FIELDS = frozenset({"id", "parameters", "inputs", "outputs"})
"""The keys of an inference request the Open Inference Protocol reads (it ignores others)."""
INFER_INPUT_FIELDS = frozenset({"name", "shape", "datatype", "parameters", "data"})
"""The keys of an inference request's input the protocol reads (it ignores others)."""
NAMED_UNKNOWN = 10
"""Unknown keys named when an object has more keys than its reader knows."""
EXTRA_FIELD = "Extra inputs are not permitted"
"""What /v1 says of each unknown field (pydantic's words)."""


def _unknown(keys: Iterator[str], fields: Collection[str]) -> list[str]:
    """The first :data:`NAMED_UNKNOWN` of ``keys`` that are not ``fields`` (read no further than they are found)."""
    return list(islice((k for k in keys if k not in fields), NAMED_UNKNOWN))


def _too_many_keys(n: int, fields: Collection[str], unknown: list[str], where: str | None) -> Refused:
    """The refusal of an object with ``n`` keys, more than the ``len(fields)`` it may have (``where``: None for the
    body, else the field that holds the object).
    """
    names = ", ".join(repr(k) if len(k) <= 64 else repr(k[:64]) + "..." for k in unknown)
    names += ", ..." if n - len(fields) > len(unknown) else ""
    if where is None:
        message = f"the body has {n} fields, more than the {len(fields)} names its request knows"
    else:
        message = f"{where} has {n} fields, more than a tensor object's {', '.join(sorted(fields))}"
    message += f"; unknown fields are not permitted: {names}"
    errors: list[FieldError]
    if where is None:
        errors = [{"loc": [key], "msg": EXTRA_FIELD} for key in unknown]
    else:
        errors = [{"loc": [where], "msg": message}]
    return Refused("body_fields", message, errors)


def check_fields(obj: dict[str, Any], fields: Collection[str]) -> None:
    """Refuse a body read as ``obj`` when it has more keys than ``fields`` (:class:`Refused`, naming the first
    unknown ones).
    """
    if len(obj) > len(fields):
        unknown = _unknown(iter(obj), fields)
        if unknown:
            raise _too_many_keys(len(obj), fields, unknown, None)


def _items(
    obj: simdjson.Object, fields: Collection[str] | None = None, *, strict: bool = False, where: str | None = None
) -> list[tuple[str, Any]]:
    """The (key, proxy) pairs of an object (``items()`` would convert every value to Python).

    Each lookup scans the object, so with more keys than ``fields`` a ``strict`` reader refuses it (``where``: the
    field holding it, None for the body), having read its keys only up to the first unknown ones, and any other
    gets the known keys' pairs only (in one pass over the keys). ``fields`` None: every key is looked up.
    """
    if fields is None or len(obj) <= len(fields):  # simdjson keeps the count: no scan
        keys = list(obj)
    else:
        if strict:
            unknown = _unknown(iter(obj), fields)
            if unknown:
                raise _too_many_keys(len(obj), fields, unknown, where)
        keys = [k for k in obj if k in fields]
    if len(set(keys)) != len(keys):
        raise _Duplicate
    return [(k, obj[k]) for k in keys]


def _convert_object(
    obj: simdjson.Object, fields: Collection[str], *, strict: bool = False, where: str | None = None
) -> dict[str, Any]:
    """An object whose ``data`` stays lazy (a tensor in object form, an inference input)."""
    return {k: _lazy(v) if k == "data" else _field(k, v) for k, v in _items(obj, fields, strict=strict, where=where)}


def _parse_lazily(
    body: bytes,
    on_error: Callable[[orjson.JSONDecodeError], Exception],
    convert: Callable[[str, Any], Any],
    fields: Collection[str] | None,
    *,
    strict: bool,
) -> Any:
    """A large body parsed by simdjson, each top-level ``(key, value)`` converted by ``convert`` (the keys
    :func:`_items` reads with ``fields`` and ``strict``); what orjson gives when simdjson refuses the body, its root
    is not an object, or a key is repeated.
    """
    root = _parse_simdjson(body)
    if not isinstance(root, simdjson.Object):
        return _loads(body, on_error)
    try:
        converted = {key: convert(key, value) for key, value in _items(root, fields, strict=strict)}
    except _Duplicate:
        return _loads(body, on_error)
    _confirm_walks(body, converted)
    return converted


def _confirm_walks(body: bytes, converted: dict[str, Any]) -> None:
    """Let the tensor arrays take :mod:`jsonfast`'s quick path when the body's ``[`` are all accounted for."""
    arrays: list[JsonArray] = []

    def tensor_arrays(value: Any) -> int | None:
        if not isinstance(value, JsonArray):
            return None
        arrays.append(value)
        return value.walked_arrays()

    if b"\\" in body:
        return
    expected = jsonfast.accounted_brackets(converted, tensor_arrays)
    if expected is not None and expected == body.count(b"["):
        for array in arrays:
            array.confirm_walk()


def parse_object(
    body: bytes,
    tensor_fields: Iterable[str],
    on_error: Callable[[orjson.JSONDecodeError], Exception],
    fields: Collection[str] | None = None,
) -> Any:
    """Parse a /v1-style body; the top-level ``tensor_fields`` (nested, or the ``data`` of the object form) stay
    :class:`JsonArray` when the body is large. Returns what orjson would (any JSON value) otherwise.

    ``fields``: the keys the body may have; an object with more is refused (:class:`Refused`, the module
    docstring), whatever the body's size.
    """
    wanted = frozenset(tensor_fields)
    if len(body) < SIMDJSON_MIN_BYTES or not wanted:
        obj = _loads(body, on_error)
        if fields is not None and type(obj) is dict and len(obj) > len(fields):
            check_fields(obj, fields)
        return obj

    def convert(key: str, value: Any) -> Any:
        if key not in wanted:
            return _field(key, value)
        if isinstance(value, simdjson.Object):
            return _convert_object(value, TENSOR_OBJECT_FIELDS, strict=True, where=key)
        return _lazy(value)

    return _parse_lazily(body, on_error, convert, fields, strict=True)


def parse_infer_request(body: bytes, on_error: Callable[[orjson.JSONDecodeError], Exception]) -> Any:
    """Parse an inference request (Open Inference Protocol); ``inputs[i].data`` stay :class:`JsonArray` when large."""
    if len(body) < SIMDJSON_MIN_BYTES:
        return _loads(body, on_error)

    def convert(key: str, value: Any) -> Any:
        if key != "inputs" or not isinstance(value, simdjson.Array):
            return _field(key, value)
        if len(value) > MAX_INPUTS:
            raise InvalidInput(f"inputs has {len(value)} entries; a model takes at most {MAX_INPUTS}", ("inputs",))
        return [
            _convert_object(item, INFER_INPUT_FIELDS) if isinstance(item, simdjson.Object) else _field(key, item)
            for item in value
        ]

    return _parse_lazily(body, on_error, convert, INFER_REQUEST_FIELDS, strict=False)
