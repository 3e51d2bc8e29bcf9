"""The caller's arguments, checked before any request (no I/O: every request body is built from them).

A tensor must be a rectangular array of numbers or booleans (a ragged nested list, text, ``None`` entries or
complex numbers raise :class:`ValidationError` naming the argument), integer options and lists must hold
integers (an integral float passes, a bool does not), number options must be numbers, flags must be booleans.
Ranges and shapes are the service's to judge. Options left at None stay out of a body (:func:`put`), so the
server's documented default applies.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from attention_client._wire import encode_tensor
from attention_client.errors import invalid_input
from attention_client.types import Causal

T = TypeVar("T")

_NUMERIC_KINDS = frozenset("biuf")
"""numpy dtype kinds a tensor may have: bool, signed and unsigned integers, floats."""
_KIND_NAMES = {"U": "text", "S": "bytes", "O": "Python objects (None, mixed types)", "c": "complex numbers"}


def put(body: dict[str, Any], **options: Any) -> dict[str, Any]:
    """``body`` with each option that is not None."""
    body.update({k: v for k, v in options.items() if v is not None})
    return body


def as_array(value: npt.ArrayLike, field: str) -> npt.NDArray[Any]:
    """``value`` as a numpy array of numbers or booleans, else :class:`ValidationError` naming ``field``."""
    try:
        array = np.asarray(value)
    except (ValueError, TypeError) as exc:  # numpy >= 1.24 refuses ragged nested lists with ValueError
        text = str(exc)
        if "inhomogeneous" in text or "sequence" in text:
            raise invalid_input(field, "a ragged nested list: every row must have the same length") from None
        raise invalid_input(field, f"not an array of numbers ({text})") from None
    if array.dtype.kind not in _NUMERIC_KINDS:
        what = _KIND_NAMES.get(array.dtype.kind, f"dtype {array.dtype}")
        raise invalid_input(field, f"must hold numbers (or booleans for a mask), got {what}")
    return array


def tensor(array: npt.ArrayLike | None, field: str) -> dict[str, Any] | None:
    """An optional tensor in its wire form (``b64``), None when not given."""
    return None if array is None else encode_tensor(as_array(array, field))


def required_tensor(array: npt.ArrayLike, field: str) -> dict[str, Any]:
    """A tensor in its wire form (``b64``)."""
    return encode_tensor(as_array(array, field))


def as_int(value: Any, field: str) -> int:
    """An integer (a float with an integral value is accepted; a bool is not)."""
    if isinstance(value, bool | np.bool_):
        raise invalid_input(field, f"expected an integer, got {value!r}")
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real) and math.isfinite(float(value)) and float(value).is_integer():
        return int(float(value))
    raise invalid_input(field, f"expected an integer, got {value!r}")


def as_float(value: Any, field: str) -> float:
    """A real number (a bool is not one)."""
    if isinstance(value, bool | np.bool_) or not isinstance(value, numbers.Real):
        raise invalid_input(field, f"expected a number, got {value!r}")
    return float(value)


def opt_int(value: Any, field: str) -> int | None:
    return None if value is None else as_int(value, field)


def opt_float(value: Any, field: str) -> float | None:
    return None if value is None else as_float(value, field)


def listed(values: Any, field: str, one: Callable[[Any, str], T], what: str) -> list[T] | None:
    """``one`` of each value of a list (a sequence or an array, not text) of ``what``, None when not given."""
    if values is None:
        return None
    if isinstance(values, str | bytes) or not isinstance(values, Sequence | np.ndarray):
        raise invalid_input(field, f"expected a list of {what}, got {values!r}")
    return [one(v, field) for v in values]


def int_list(values: Any, field: str) -> list[int] | None:
    """A list of integers (:func:`as_int` each), None when not given."""
    return listed(values, field, as_int, "integers")


def float_list(values: Any, field: str) -> list[float] | None:
    """A list of numbers (:func:`as_float` each), None when not given."""
    return listed(values, field, as_float, "numbers")


def flag(value: Any, field: str) -> bool:
    """A boolean (numpy's included)."""
    if isinstance(value, bool | np.bool_):
        return bool(value)
    raise invalid_input(field, f"expected True or False, got {value!r}")


def token_id_rows(value: Any) -> list[list[int]] | None:
    """``[B, S]`` token ids as lists of Python ints: a rectangular 2-D array of integers (integral floats pass)."""
    if value is None:
        return None
    if isinstance(value, str | bytes):
        raise invalid_input("token_ids", f"expected [B, S] integer token ids, got {value!r}")
    array = as_array(value, "token_ids")
    if array.ndim != 2:
        raise invalid_input("token_ids", f"expected [B, S] integer token ids (2 axes), got shape {list(array.shape)}")
    if array.dtype.kind == "b" or (
        array.dtype.kind == "f" and not (np.isfinite(array).all() and (array == np.round(array)).all())
    ):
        raise invalid_input("token_ids", f"expected integer token ids, got {array.dtype} values")
    return [[int(v) for v in row] for row in array.tolist()]


def causal_option(value: Any) -> Causal | None:
    """``causal``: a boolean, ``"top_left"`` or ``"bottom_right"``, None when not given."""
    if value is None or isinstance(value, bool):
        return value
    if value in ("top_left", "bottom_right"):
        return value  # type: ignore[no-any-return]  # one of the two literals
    if isinstance(value, np.bool_):
        return bool(value)
    raise invalid_input("causal", f"expected True, False, 'top_left' or 'bottom_right', got {value!r}")
