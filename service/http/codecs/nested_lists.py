"""Why nested JSON lists are not a tensor: the first offending element, in the service's words.

Decoders try ``np.array`` first; only when it fails or gives the wrong kind of array is the body walked
here, to name the element (``query is ragged at index [1]: ...``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from service.dataplane.tensors import index_text


def describe(value: Any) -> str:
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
        where = f"{label}{index_text(index)}" if index else label
        if depth < ndim:
            if not isinstance(v, list):
                return ArrayProblem(
                    index,
                    (
                        f"{label} is ragged at index {index_text(index)}: {where} is {describe(v)} "
                        f"where a list of {dims[depth]} values is expected (the array must be rectangular)"
                    ),
                    True,
                )
            if len(v) != dims[depth]:
                sibling = f"{label}{index_text(index[:-1] + (0,))}" if index else label
                return ArrayProblem(
                    index,
                    (
                        f"{label} is ragged at index {index_text(index)}: {where} has {len(v)} "
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
                    f"{label} is ragged at index {index_text(index)}: {where} is a list where a number is expected "
                    "(the array must be rectangular)"
                ),
                True,
            )
        is_bool = isinstance(v, bool)
        is_number = not is_bool and isinstance(v, int | float)
        if expect == "booleans" and not is_bool:
            return ArrayProblem(index, f"{where} must be true or false, got {describe(v)}")
        if expect == "integers" and isinstance(v, float) and v.is_integer() and abs(v) >= 2.0**63:
            return ArrayProblem(index, f"{where} = {v:.0f} is out of range for a 64-bit integer")
        if expect == "integers" and not (is_number and isinstance(v, int)):
            return ArrayProblem(index, f"{where} must be an integer, got {describe(v)}")
        if expect == "numbers" and not is_number:
            hint = ""
            if isinstance(v, str) and v.strip().lower() in _NON_FINITE_WORDS:
                hint = " (JSON has no NaN or infinity, and values must be finite numbers)"
            return ArrayProblem(index, f"{where} must be a number, got {describe(v)}{hint}")
        if expect == "numbers or booleans":
            if not (is_bool or is_number):
                return ArrayProblem(index, f"{where} must be a boolean or a number, got {describe(v)}")
            if first_kind is None:
                first_kind = (index, v)
            elif isinstance(first_kind[1], bool) != is_bool:
                first = f"{label}{index_text(first_kind[0])}"
                return ArrayProblem(
                    index,
                    (
                        f"{label} mixes booleans and numbers ({first} is {describe(first_kind[1])}, {where} is "
                        f"{describe(v)}), which is ambiguous: send only booleans (true = may attend) or only "
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
