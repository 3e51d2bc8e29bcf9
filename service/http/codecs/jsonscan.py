"""The structure of a JSON array read from its bytes with numpy: no Python object per element or per inner list.

A large body's tensor arrays stay in simdjson's tape (:class:`~service.http.codecs.jsonbody.JsonArray`); what
the decoders need to know of one before taking its numbers is here, computed from its minified bytes
(``simdjson.Array.mini``) with a handful of vectorised passes:

- :func:`analyse`: its nested shape when it is *rectangular* (every array of a level has the same length, scalars
  sit at the last level only, no string or object), and which scalars it holds (numbers, booleans, null; a number
  written with a fraction or an exponent);
- :meth:`Analysis.problem`: otherwise, the first reason in document order why it is not a rectangular array of
  what is expected, in the words and at the index :func:`~service.http.codecs.nested_lists.find_problem` gives for
  the same value as Python lists.

So an array of three million empty lists, or a ragged one of millions of numbers, costs a few passes over its
bytes (``[[],[],...]``: 8.6 MB took 1.1 s of the interpreter's lock and 350-750 MB as Python lists).

How: with the bytes of strings and objects masked (each is one value here, and a problem in any tensor),
``depth`` is the running count of ``[`` minus ``]``; the arrays of level ``k`` open where a
``[`` brings it to ``k + 1``, and their children are counted by the commas at depth ``k + 1`` between one such
``[`` and the next (``np.add.reduceat``), plus one unless the array is ``[]``; a scalar starts at a byte that is
not ``[``, ``]`` or ``,`` and follows ``[`` or ``,``, and the enclosing depth tells where it sits.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from service.dataplane.tensors import index_text
from service.http.codecs.nested_lists import ArrayProblem, Expect, describe

OPEN, CLOSE, COMMA = ord("["), ord("]"), ord(",")
_DELTA = np.zeros(256, dtype=np.int8)
_DELTA[OPEN], _DELTA[CLOSE] = 1, -1
_SEPARATOR = np.zeros(256, dtype=bool)
_SEPARATOR[[OPEN, CLOSE, COMMA]] = True
_DIGIT = np.zeros(256, dtype=bool)
_DIGIT[ord("0") : ord("9") + 1] = True
_BOOLEAN_START = np.zeros(256, dtype=bool)
_BOOLEAN_START[[ord("t"), ord("f")]] = True
SHOWN_BYTES = 256
"""The bytes of a string or token read to name it in a message (a 10 MB string took 0.73 s to match in full)."""
_NON_FINITE_WORDS = frozenset({"nan", "inf", "-inf", "+inf", "infinity", "-infinity", "+infinity"})


@dataclass(frozen=True, slots=True)
class Structure:
    """What an array holds: its rectangular shape (None when it is not rectangular), and its scalars' kinds."""

    shape: tuple[int, ...] | None
    numbers: int
    booleans: int
    nulls: int
    fractions: bool
    """A number is written with a fraction or an exponent (a float in JSON's terms)."""

    @property
    def only_numbers(self) -> bool:
        return self.shape is not None and not self.booleans and not self.nulls

    @property
    def only_booleans(self) -> bool:
        return self.shape is not None and not self.numbers and not self.nulls


class Analysis:
    """One pass over a minified JSON array (module docstring); :meth:`structure` and :meth:`problem` read it.

    Everything after the first pass works on the structural bytes alone (``[``, ``]``, ``,``: a tenth of the
    bytes of a float array): their positions, characters, and the depth after each.
    """

    def __init__(self, mini: bytes) -> None:
        self.mini = mini
        b = self.b = np.frombuffer(mini, dtype=np.uint8)
        n = len(b)
        # Strings and objects are single values here: their bytes are masked out of the structure.
        s = self.s = _opaque_masked(b) if (mini.find(b'"') >= 0 or mini.find(b"{") >= 0) else b
        rank = 0
        while rank < n and mini[rank] == OPEN:  # the leading '[': the depth of the first element chain
            rank += 1
        self.rank = rank
        pos = self.pos = _structural_positions(s)  # where each structural byte is
        ch = self.ch = s[pos]  # which it is
        delta = (ch == OPEN).view(np.int8) - (ch == CLOSE).view(np.int8)
        self.sdepth = np.cumsum(delta, dtype=np.int32)  # the depth after each
        following = np.empty(len(pos), dtype=np.int64)
        following[:-1] = pos[1:]
        following[-1:] = n
        # a scalar (string, object) starts after '[' or ',' unless a structural byte follows at once
        self.scalar_after = ((ch == OPEN) | (ch == COMMA)) & (following != pos.astype(np.int64) + 1)
        self.opens: list[np.ndarray] = []  # positions of the arrays of each level below the rank
        self.counts: list[np.ndarray] = []  # their lengths
        for k in range(self.rank):
            idx = np.flatnonzero((ch == OPEN) & (self.sdepth == k + 1))
            commas = np.cumsum((ch == COMMA) & (self.sdepth == k + 1), dtype=np.int32)
            nxt = np.empty_like(idx)
            nxt[:-1] = idx[1:]
            nxt[-1:] = len(ch)
            counts = (commas[nxt - 1] - commas[idx]).astype(np.int64)  # its commas: up to the next of its level
            counts += self.scalar_after[idx] | (ch[idx + 1] != CLOSE)  # one more child than commas, unless empty
            self.opens.append(pos[idx])
            self.counts.append(counts)
        self.dims = [int(c[0]) for c in self.counts]

    def _scalars(self, where: np.ndarray) -> np.ndarray:
        """The first bytes' positions of the scalars after the structural bytes selected by ``where``."""
        starts: np.ndarray = self.pos[where & self.scalar_after].astype(np.int64) + 1
        return starts

    # -- the structure ----------------------------------------------------------------------------------------

    def _structural(self) -> tuple[int, str] | None:
        """The first structural problem: (position, kind) with kind ``length``, ``list`` or ``scalar``."""
        found: list[tuple[int, str]] = []
        for k, counts in enumerate(self.counts):
            bad = np.flatnonzero(counts != counts[0])
            if len(bad):
                found.append((int(self.opens[k][bad[0]]), "length"))
        deep = (self.ch == OPEN) & (self.sdepth > self.rank)
        if deep.any():
            found.append((int(self.pos[np.argmax(deep)]), "list"))
        shallow = self._scalars(self.sdepth < self.rank)
        if len(shallow):
            found.append((int(shallow[0]), "scalar"))
        return min(found) if found else None

    def structure(self) -> Structure:
        """The shape when rectangular, and the scalars' kinds (strings and objects count as neither)."""
        first = self.b[self._scalars(np.ones(len(self.ch), dtype=bool))]
        booleans = int(np.count_nonzero(_BOOLEAN_START[first]))
        nulls = int(np.count_nonzero(first == ord("n")))
        others = int(np.count_nonzero((first == ord('"')) | (first == ord("{"))))
        numbers = len(first) - booleans - nulls - others
        shape = tuple(self.dims) if self._structural() is None else None
        if others:  # a tensor holds no string or object: the decoders look for the problem
            shape = None
        return Structure(shape, numbers, booleans, nulls, bool(self._fraction_bytes().any()))

    # -- the first problem --------------------------------------------------------------------------------------

    def _index(self, p: int, node_depth: int) -> tuple[int, ...]:
        """The index of the node that starts at byte ``p``, ``node_depth`` arrays deep."""
        index = []
        for j in range(node_depth):
            opens = self.opens[j]
            ancestor = int(opens[np.searchsorted(opens, p, side="right") - 1])
            commas = self.pos[(self.ch == COMMA) & (self.sdepth == j + 1)]
            index.append(int(np.searchsorted(commas, p) - np.searchsorted(commas, ancestor)))
        return tuple(index)

    def _end(self, p: int) -> int:
        """Where the scalar (or string, or object) that starts at byte ``p`` ends: at the next structural byte, since
        the bytes of strings and objects are masked out of them.
        """
        i = int(np.searchsorted(self.pos, p, side="right"))
        return int(self.pos[i]) if i < len(self.pos) else len(self.mini)

    def _value(self, p: int) -> Any:
        """The scalar (or string, or object) that starts at byte ``p``, as Python reads it; a string or token
        longer than :data:`SHOWN_BYTES` by its first bytes only (the messages show 20 characters).
        """
        if self.b[p] == ord("{"):
            return {}
        end = self._end(p)
        if self.b[p] == ord('"'):
            return _string(self.mini[p:end] if end - p <= SHOWN_BYTES else self.mini[p : p + SHOWN_BYTES])
        token = self.mini[p : min(end, p + SHOWN_BYTES)]
        try:
            return json.loads(token)
        except ValueError:
            return token.decode("ascii", "replace")

    def problem(self, label: str, expect: Expect) -> ArrayProblem | None:
        """The first reason, in document order, why the array is not a rectangular array of ``expect``, in the
        words and at the index of :func:`~service.http.codecs.nested_lists.find_problem` (None when it is one).
        """
        candidates: list[tuple[int, str]] = []
        structural = self._structural()
        if structural is not None:
            candidates.append(structural)
        positions = self._scalars(self.sdepth == self.rank)
        first = self.b[positions]
        is_bool = _BOOLEAN_START[first]
        is_null = (first == ord("n")) | (first == ord('"')) | (first == ord("{"))  # never a tensor's value
        if expect == "booleans":
            wrong = ~is_bool
        elif expect == "numbers or booleans":
            wrong = is_null.copy()
            if len(first):
                other = ~is_bool if is_bool[0] else is_bool
                mixed = np.flatnonzero(other & ~is_null)
                if len(mixed):
                    candidates.append((int(positions[mixed[0]]), "mixed"))
        elif expect == "integers":
            wrong = is_bool | is_null
            floats = self._float_leaves(positions)
            if len(floats):
                wrong[floats[0]] = True
        else:
            wrong = is_bool | is_null
        bad = np.flatnonzero(wrong)
        if len(bad):
            candidates.append((int(positions[bad[0]]), "type"))
        if not candidates:
            return None
        p, what = min(candidates)
        return self._describe(p, what, label, expect, positions)

    def _depth_at(self, p: int) -> int:
        """How many arrays enclose the node that starts at byte ``p``."""
        i = int(np.searchsorted(self.pos, p, side="right")) - 1  # the last structural byte at or before p
        depth = int(self.sdepth[i])
        return depth - 1 if self.pos[i] == p and self.ch[i] == OPEN else depth

    def _float_leaves(self, leaves: np.ndarray) -> np.ndarray:
        """Which of the scalars starting at ``leaves`` (sorted positions) are numbers with a fraction or an exponent."""
        marks = np.flatnonzero(self._fraction_bytes())
        if not len(leaves) or not len(marks):
            return np.zeros(0, dtype=np.int64)
        owner = np.searchsorted(leaves, marks, side="right") - 1  # the last leaf starting at or before each mark
        marks, owner = marks[owner >= 0], owner[owner >= 0]
        ends = self.pos[np.searchsorted(self.pos, leaves[owner])]  # the structural byte after each such leaf
        return np.unique(owner[marks < ends])

    def _fraction_bytes(self) -> np.ndarray:
        """The bytes that make a number a float: a decimal point, or an exponent after a digit ("true" has an e)."""
        b = self.s
        out: np.ndarray = b == ord(".")
        exponent = (b[1:] == ord("e")) | (b[1:] == ord("E"))
        out[1:] |= exponent & _DIGIT[b[:-1]]
        return out

    def _describe(self, p: int, what: str, label: str, expect: Expect, positions: np.ndarray) -> ArrayProblem:
        node_depth = self._depth_at(p)
        index = self._index(p, node_depth)
        where = f"{label}{index_text(index)}" if index else label
        at = f"{label} is ragged at index {index_text(index)}: {where}"
        if what == "length":
            n = int(self.counts[node_depth][int(np.searchsorted(self.opens[node_depth], p))])
            sibling = f"{label}{index_text(index[:-1] + (0,))}" if index else label
            return ArrayProblem(
                index,
                f"{at} has {n} value{'s' if n != 1 else ''} where {sibling} has {self.dims[node_depth]} "
                "(the array must be rectangular)",
                True,
            )
        if what == "list":
            message = f"{at} is a list where a number is expected (the array must be rectangular)"
            return ArrayProblem(index, message, True)
        value = self._value(p)
        if what == "scalar":
            return ArrayProblem(
                index,
                f"{at} is {describe(value)} where a list of {self.dims[node_depth]} values is expected "
                "(the array must be rectangular)",
                True,
            )
        if what == "mixed":
            p0 = int(positions[0])
            first_index = self._index(p0, self.rank)
            first = f"{label}{index_text(first_index)}"
            return ArrayProblem(
                index,
                f"{label} mixes booleans and numbers ({first} is {describe(self._value(p0))}, {where} is "
                f"{describe(value)}), which is ambiguous: send only booleans (true = may attend) or only numbers "
                "(added to the scores)",
            )
        if expect == "booleans":
            return ArrayProblem(index, f"{where} must be true or false, got {describe(value)}")
        if expect == "integers":
            if isinstance(value, float) and value.is_integer() and abs(value) >= 2.0**63:
                return ArrayProblem(index, f"{where} = {value:.0f} is out of range for a 64-bit integer")
            return ArrayProblem(index, f"{where} must be an integer, got {describe(value)}")
        if expect == "numbers or booleans":
            return ArrayProblem(index, f"{where} must be a boolean or a number, got {describe(value)}")
        hint = ""
        if isinstance(value, str) and value.strip().lower() in _NON_FINITE_WORDS:
            hint = " (JSON has no NaN or infinity, and values must be finite numbers)"
        return ArrayProblem(index, f"{where} must be a number, got {describe(value)}{hint}")


def _string(text: bytes) -> str:
    """A JSON string (its opening quote first) as Python reads it, or as much of it as reads when it is cut short
    (mid-escape or mid-character) or is not valid.
    """
    if len(text) >= 2 and text.endswith(b'"'):
        try:
            return str(json.loads(text))
        except ValueError:
            pass
    for cut in range(len(text), max(len(text) - 8, 1), -1):  # an escape is at most 6 bytes, a character 4
        try:
            return str(json.loads(text[:cut] + b'"'))
        except ValueError:
            continue
    return text[1:].decode("utf-8", "replace")


def _opaque_masked(b: np.ndarray) -> np.ndarray:
    """``b`` with every byte of a string or an object replaced by a letter, so that only the array's own brackets and
    commas are left. A quote delimits a string unless an odd run of backslashes precedes it (simdjson's minified
    form escapes only quotes, backslashes and control characters).
    """
    quotes = np.flatnonzero(b == ord('"'))
    delimiter = np.zeros(len(b), dtype=bool)
    delimiter[quotes] = True
    backslash = ord("\\")
    after = quotes[(quotes > 0) & (b[np.maximum(quotes - 1, 0)] == backslash)]  # after a backslash: rare
    if len(after):  # the run of backslashes before each, measured from where the run starts (no loop per byte)
        is_backslash = b == backslash
        starts = np.flatnonzero(is_backslash[1:] & ~is_backslash[:-1]) + 1
        if is_backslash[0]:
            starts = np.concatenate(([0], starts))
        run = after - starts[np.searchsorted(starts, after, side="right") - 1]
        delimiter[after] = run % 2 == 0
    in_string = (np.cumsum(delimiter, dtype=np.uint8) & 1).astype(bool) | delimiter
    out = b.copy()
    out[in_string] = ord("s")
    braces = np.zeros(256, dtype=np.int8)
    braces[ord("{")], braces[ord("}")] = 1, -1
    in_object = (np.cumsum(braces[out], dtype=np.int16) > 0) | (out == ord("}"))
    out[in_object & (out != ord("{"))] = ord("o")
    out[in_object & (out == ord("{"))] = ord("o")
    return out


def _structural_positions(s: np.ndarray, chunk: int = 1 << 23) -> np.ndarray:
    """The positions of the ``[``, ``]`` and ``,`` bytes, as 32-bit integers (taken in chunks: numpy gives 64)."""
    parts = []
    for start in range(0, len(s), chunk):
        part = s[start : start + chunk]
        found = np.flatnonzero((part == OPEN) | (part == CLOSE) | (part == COMMA))
        parts.append((found + start).astype(np.int32))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)


def booleans(mini: bytes, shape: tuple[int, ...]) -> np.ndarray:
    """The values of a rectangular array of booleans (:attr:`Structure.only_booleans`), from their first bytes."""
    analysis = Analysis(mini)
    values: np.ndarray = analysis.b[analysis._scalars(np.ones(len(analysis.ch), dtype=bool))] == ord("t")
    return values.reshape(shape)
