"""Errors raised by the core maths.

They carry the location of the offending field so that the front ends can
turn them into precise validation errors without knowing the maths, and, for
numbers that do not fit, what would help as data (``remedies``), so that each
front end can phrase the advice in its own terms (/v1's ``"precision":
"float64"``, /v2's datatype ``FP64``) while the message keeps /v1's wording.

Remedies, in the order a message gives them:

- ``"float64"``: the request computes in float32 and float64 holds the numbers;
- ``"smaller_inputs"``: smaller queries, keys, logits or scale;
- ``"larger_temperature"``: a larger temperature;
- ``"smaller_penalties"``: smaller repetition, frequency or presence penalties;
- ``"omit_log"``: leave out the log-probabilities (the probabilities are representable).
"""

from __future__ import annotations

from collections.abc import Sequence

REMEDIES = ("float64", "smaller_inputs", "larger_temperature", "smaller_penalties", "omit_log")


class _Remedied:
    """The ``remedies`` of an error, and ``remedy``: ``"float64"`` when a wider precision is one of them."""

    remedies: tuple[str, ...]

    def _set_remedies(self, remedies: Sequence[str]) -> None:
        unknown = set(remedies) - set(REMEDIES)
        if unknown:
            raise ValueError(f"unknown remedies {sorted(unknown)}; expected some of {REMEDIES}")
        self.remedies = tuple(remedies)

    @property
    def remedy(self) -> str | None:
        """``"float64"`` where computing in float64 would let the request succeed, else None (read ``remedies``)."""
        return "float64" if "float64" in self.remedies else None


class InvalidInput(_Remedied, ValueError):
    """An input the contract rejects (bad shape, bad option, non-finite value).

    ``loc`` names the field, and where it helps the dimension or element index,
    e.g. ``("key", "shape", 3)`` or ``("query", 0, 2, 5)``. ``remedies`` (module
    docstring) are given where a value does not fit the compute dtype.
    """

    def __init__(self, message: str, loc: tuple[str | int, ...] = (), *, remedies: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.message = message
        self.loc = loc
        self._set_remedies(remedies)


class NumericalError(_Remedied, ArithmeticError):
    """A result could not be represented finitely (e.g. float32 overflow of Q K^T).

    ``remedies`` (module docstring) say what would help, as data; the message says it in /v1's words.
    """

    def __init__(self, message: str, *, remedies: Sequence[str] = ()) -> None:
        super().__init__(message)
        self._set_remedies(remedies)


def wider_remedies(dtype_name: str, *others: str) -> tuple[str, ...]:
    """``("float64", *others)`` for a float32 computation, ``others`` where float64 is already in force."""
    return (("float64",) if dtype_name != "float64" else ()) + others
