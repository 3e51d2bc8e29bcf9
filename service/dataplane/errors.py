"""The data plane's one error type: a kind that each front end maps to its own status.

=================  ==========  ==========  ====================
kind               /v1 (REST)  /v2 (REST)  gRPC
=================  ==========  ==========  ====================
``INVALID``        422         400         INVALID_ARGUMENT
``NOT_FOUND``      404         404         NOT_FOUND
``TOO_LARGE``      413         413         RESOURCE_EXHAUSTED
``UNAVAILABLE``    503         503         UNAVAILABLE
``TIMEOUT``        504         504         DEADLINE_EXCEEDED
=================  ==========  ==========  ====================

The core's own errors (:class:`~service.core.errors.InvalidInput`, which names the field, and
:class:`~service.core.errors.NumericalError`) become ``INVALID`` service errors with the same message
(:func:`as_service_error`); nothing here knows a protocol.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any

from service.core.errors import InvalidInput, NumericalError


class Kind(enum.Enum):
    """What went wrong, in terms every protocol has a status for."""

    INVALID = "invalid_argument"
    """The request is wrong: a field, a shape, a value, a number that overflows; ``errors`` name the field."""
    NOT_FOUND = "not_found"
    """The request names something the server does not have (a model, a version)."""
    TOO_LARGE = "too_large"
    """Over a size, work or memory limit: smaller requests may succeed."""
    UNAVAILABLE = "unavailable"
    """Not now: overloaded, starting, an engine not ready; ``retry_after_s`` when a retry may help."""
    TIMEOUT = "timeout"
    """The request's deadline passed."""


FieldError = dict[str, Any]
"""``{"loc": [field, index, ...], "msg": "..."}``: one offending field."""


class ServiceError(Exception):
    """An answerable failure of one request: its kind, a message for the client, the offending fields,
    and how long to wait before a retry (``UNAVAILABLE`` only; None when retrying cannot help).

    ``remedy``: a structured hint the front ends may phrase in their own terms (``"float64"``: the
    request computes in float32 and float64 would hold the numbers), copied from the core's
    :class:`~service.core.errors.InvalidInput` and :class:`~service.core.errors.NumericalError` alike.
    """

    def __init__(
        self,
        kind: Kind,
        message: str,
        *,
        errors: Sequence[FieldError] | None = None,
        retry_after_s: int | None = None,
        remedy: str | None = None,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.errors = list(errors) if errors is not None else None
        self.retry_after_s = retry_after_s
        self.remedy = remedy

    def __repr__(self) -> str:
        return f"ServiceError({self.kind.name}, {self.message!r})"


V1_REMEDY_WORDS = {"float64": "precision float64"}
"""How the core's messages (written in /v1's words) name each remedy that front ends express differently."""
OIP_REMEDY_WORDS = {"float64": "the FP64 datatype"}
"""The same remedies in the Open Inference Protocol's terms (/v2 and gRPC have no ``precision``: FP64 inputs
compute in float64)."""


def phrased(error: ServiceError, words: dict[str, str]) -> str:
    """``error``'s message with its remedy in a front end's own words (``words``, e.g. :data:`OIP_REMEDY_WORDS`)."""
    remedy = error.remedy
    if remedy is None or remedy not in words or remedy not in V1_REMEDY_WORDS:
        return error.message
    return error.message.replace(V1_REMEDY_WORDS[remedy], words[remedy])


def invalid(message: str, *loc: str | int) -> ServiceError:
    """An ``INVALID`` error naming the field ``loc`` (a path: field, then indices)."""
    return ServiceError(Kind.INVALID, message, errors=[{"loc": list(loc), "msg": message}])


def too_large(message: str) -> ServiceError:
    return ServiceError(Kind.TOO_LARGE, message)


def unavailable(message: str, retry_after_s: int | None) -> ServiceError:
    return ServiceError(Kind.UNAVAILABLE, message, retry_after_s=retry_after_s)


def not_found(message: str) -> ServiceError:
    return ServiceError(Kind.NOT_FOUND, message)


def as_service_error(exc: BaseException) -> ServiceError | None:
    """``exc`` as a :class:`ServiceError`: itself, or the core's errors as ``INVALID``; None for anything else
    (a bug, which no client should be blamed for).
    """
    if isinstance(exc, ServiceError):
        return exc
    if isinstance(exc, InvalidInput):
        return ServiceError(
            Kind.INVALID, exc.message, errors=[{"loc": list(exc.loc), "msg": exc.message}], remedy=exc.remedy
        )
    if isinstance(exc, NumericalError):
        message = str(exc)
        return ServiceError(
            Kind.INVALID, message, errors=[{"loc": [], "msg": message}], remedy=getattr(exc, "remedy", None)
        )
    return None


ANSWERABLE = (ServiceError, InvalidInput, NumericalError)
"""What a request can be refused with (:func:`as_service_error` turns each into a ``ServiceError``)."""
