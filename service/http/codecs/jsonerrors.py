"""Precise JSON errors: where a body orjson refused holds a literal ``NaN`` or ``Infinity`` (JSON has neither) or a
number beyond float64, found by re-reading the body with the standard library's parser, whose hooks see those
tokens, and named by its path (``query[0, 1]``).
"""

from __future__ import annotations

import json
import math
from typing import Any

import orjson

LOCATE_MAX_BYTES = 8 << 20
"""Largest body re-read by the standard library's parser to locate a NaN or an overflowing number."""

Path = tuple[str | int, ...]


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


_NUMBER_START = frozenset(b"+-.0123456789")
_NUMBER_BYTES = _NUMBER_START | frozenset(b"eE")
SHOWN_TOKEN = 32
"""A malformed number is shown by at most this many characters."""


def _written_as(token: str) -> str | None:
    """How a number JSON refuses should be written, or None when ``token`` is not such a number."""
    body = token.lstrip("+-")
    sign = "-" if token.startswith("-") else ""
    if token.startswith("+") and body[:1].isdigit():
        return f"JSON numbers have no plus sign (write {body})"
    if body.startswith("."):
        return f"JSON numbers start with a digit (write {sign}0{body})"
    if len(body) > 1 and body[0] == "0" and body[1].isdigit():
        digits = body.lstrip("0")
        return f"JSON numbers have no leading zeros (write {sign}{'0' if digits[:1] in ('', '.') else ''}{digits})"
    mantissa = body.split("e")[0].split("E")[0]
    if mantissa.endswith("."):
        return f"JSON needs a digit after the decimal point (write {sign}{mantissa}0{body[len(mantissa) :]})"
    if body[-1:] in ("e", "E", "+", "-"):
        return "JSON needs digits after the exponent"
    if not body:
        return "a sign must be followed by digits"
    return None


def describe_syntax_error(body: bytes, exc: orjson.JSONDecodeError) -> str:
    """Orjson's message, and where it stopped in a number JSON does not allow (``.5``, ``+1``, ``01``, ``1.``), that
    number and how JSON writes it: orjson's own words for ``.5`` are "no digit after sign".
    """
    data = bytes(body)
    start = exc.pos
    while start > 0 and data[start - 1] in _NUMBER_BYTES:
        start -= 1
    end = exc.pos
    while end < len(data) and data[end] in _NUMBER_BYTES:
        end += 1
    token = data[start:end].decode("ascii")
    if not token or token[0] not in "+-.0123456789" or (advice := _written_as(token)) is None:
        return str(exc)
    shown = token if len(token) <= SHOWN_TOKEN else token[:SHOWN_TOKEN] + "..."
    line = data.count(b"\n", 0, start) + 1
    column = start - (data.rfind(b"\n", 0, start) + 1) + 1
    return f"{shown!r} at line {line} column {column} is not a JSON number: {advice}"
