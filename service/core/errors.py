"""Errors raised by the core maths.

They carry the location of the offending field so that the HTTP layer can
turn them into precise validation errors without knowing the maths.
"""

from __future__ import annotations


class InvalidInput(ValueError):
    """An input the contract rejects (bad shape, bad option, non-finite value).

    ``loc`` names the field, and where it helps the dimension or element index,
    e.g. ``("key", "shape", 3)`` or ``("query", 0, 2, 5)``.
    """

    def __init__(self, message: str, loc: tuple[str | int, ...] = ()) -> None:
        super().__init__(message)
        self.message = message
        self.loc = loc


class NumericalError(ArithmeticError):
    """A result could not be represented finitely (e.g. float32 overflow of Q K^T)."""
