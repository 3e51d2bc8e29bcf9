"""The REST front end's own refusals, raised where a request is read: :class:`ProblemError` (HTTP-level: the body's
encoding, the media type, JSON syntax; answered with its status), :class:`Refused` (an invalid body refused before
it costs what its size would let it, and counted), and pydantic's validation errors as the field errors of a 422.
How each is answered, in each protocol's error body, is :mod:`service.http.error_responses`.
"""

from __future__ import annotations

from collections.abc import Sequence

from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from service.dataplane.errors import FieldError, Kind, ServiceError


class ProblemError(Exception):
    """An HTTP-level refusal (body encoding, media type, JSON syntax) answered with the given status."""

    def __init__(
        self,
        status: int,
        detail: str,
        *,
        errors: Sequence[FieldError] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.errors = list(errors) if errors is not None else None
        self.headers = headers or {}


class Refused(ServiceError):
    """An invalid body refused before it costs what its size would let it (422 on /v1), counted in the metrics'
    refusals under ``reason`` (one of :data:`service.observability.metrics.REJECT_REASONS`).
    """

    def __init__(self, reason: str, message: str, errors: list[FieldError]) -> None:
        super().__init__(Kind.INVALID, message, errors=errors)
        self.reason = reason


def pydantic_errors(
    exc: ValidationError | RequestValidationError, prefix: Sequence[str | int] = ()
) -> list[FieldError]:
    """Pydantic's errors as ``{"loc", "msg"}`` pairs, with no input echoed back."""
    out = []
    for err in exc.errors():
        loc = [p for p in err.get("loc", ()) if p not in ("body",)]
        out.append({"loc": [*prefix, *loc], "msg": str(err.get("msg", "invalid value"))})
    return out


def summarize(errors: Sequence[FieldError]) -> str:
    """One line that names each failing field."""
    parts = []
    for err in errors[:5]:
        where = ".".join(str(p) for p in err["loc"]) or "body"
        parts.append(f"{where}: {err['msg']}")
    more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
    return "; ".join(parts) + more
