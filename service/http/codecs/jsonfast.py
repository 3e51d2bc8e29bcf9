"""The quick check of an ordinary tensor array in a large JSON body: rectangular, numbers only, no hidden arrays.

:mod:`service.http.codecs.jsonscan` reads any array's structure from its minified bytes, whatever it holds,
at the cost of its bytes (about 9 ms for each 1 MB array of floats: simdjson writes the text back, then
numpy scans it). Most tensors are plain rectangular arrays of numbers with few inner lists, and for them
three cheap facts decide the same question:

1. every array of each level has the length of that level's first one (:func:`rectangular_shape`: one
   Python step per inner list, allowed only for arrays of at most :data:`FAST_MAX_ARRAYS` lists, so an
   array of millions of empty lists never reaches it);
2. ``as_buffer`` gives exactly the product of that shape in numbers (it flattens recursively and fails on
   booleans, strings and null);
3. the body holds no ``[`` beyond those arrays and the other fields' (counted in the converted values; a
   body with a backslash, whose strings may not read as written, is not checked this way): so no list
   hides among a row's numbers (``[1, [5], 3]`` has three elements and three numbers too).

An array that passes all three has that shape and holds numbers only; any other takes jsonscan's path,
whose answers (and messages) are the precise ones.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import simdjson

FAST_MAX_ARRAYS = 1 << 14
"""Most inner lists of an array checked in Python (a (1, 8, 128, 64) tensor has 1,033)."""
INT64_LIMIT = float(1 << 63)
"""simdjson's int64 buffer refuses a number written with a fraction, and an integer from here on as well."""


def lead_dims(array: simdjson.Array) -> tuple[int, ...]:
    """The lengths along the first elements: one proxy per level, whatever the array holds."""
    dims: list[int] = []
    node: Any = array
    while isinstance(node, simdjson.Array):
        n = len(node)
        dims.append(n)
        if n == 0:
            break
        node = node[0]
    return tuple(dims)


def rectangular_shape(array: simdjson.Array) -> tuple[tuple[int, ...], int] | None:
    """The nested shape of ``array`` and its number of arrays when every level is rectangular (arrays inside the
    last level's are not seen: the caller counts brackets); None when ragged, empty, or too many lists to walk.
    """
    dims = lead_dims(array)
    if not dims or dims[-1] == 0:
        return None
    arrays = sum(math.prod(dims[:depth]) for depth in range(len(dims)))
    if arrays > FAST_MAX_ARRAYS:
        return None
    level: list[Any] = [array]
    for depth in range(len(dims) - 1):
        size = dims[depth]
        children: list[Any] = []
        for a in level:
            if len(a) != size:
                return None
            children.extend(a)
        if not all(type(c) is simdjson.Array for c in children):
            return None
        level = children
    last = dims[-1]
    if any(len(a) != last for a in level):
        return None
    return dims, arrays


def accounted_brackets(value: Any, tensor_arrays: Callable[[Any], int | None]) -> int | None:
    """The ``[`` that a converted body accounts for: one per list, those in its strings and keys, and
    ``tensor_arrays(v)`` for a value left in the tape (None: that value cannot be accounted for).
    """
    if isinstance(value, list):
        total = 1
        for item in value:
            n = accounted_brackets(item, tensor_arrays)
            if n is None:
                return None
            total += n
        return total
    if isinstance(value, dict):
        total = 0
        for key, item in value.items():
            n = accounted_brackets(item, tensor_arrays)
            if n is None:
                return None
            total += key.count("[") + n
        return total
    if isinstance(value, str):
        return value.count("[")
    if isinstance(value, int | float | bool) or value is None:
        return 0
    return tensor_arrays(value)


def numbers_in_shape(array: simdjson.Array, shape: tuple[int, ...]) -> tuple[np.ndarray, bool] | None:
    """The numbers of ``array`` as a float64 array of ``shape``, and whether any is written with a fraction or an
    exponent (simdjson's int64 buffer refuses one: at the first, for float data); None unless ``as_buffer`` gives
    exactly that many numbers (booleans, strings or null: jsonscan says which and where).
    """
    try:
        flat = np.frombuffer(array.as_buffer(of_type="d"), dtype=np.float64)
    except (TypeError, ValueError):
        return None
    if flat.size != math.prod(shape):
        return None
    try:
        array.as_buffer(of_type="i")
        fractions = False
    except (TypeError, ValueError, OverflowError):
        if flat.size and float(np.abs(flat).max()) >= INT64_LIMIT:
            return None  # perhaps integers beyond int64 rather than fractions: jsonscan reads how they are written
        fractions = True
    return flat.reshape(shape), fractions
