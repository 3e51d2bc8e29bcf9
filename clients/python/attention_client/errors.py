"""One exception hierarchy for everything a call can fail with.

Every error is a :class:`ServiceError`. Answers of the service carry its RFC 9457
problem+json fields (``type``, ``title``, ``status``, ``detail``, ``errors``); an error
body that is not JSON (a proxy's HTML page, a plain-text 502) still gives a
``ServiceError`` whose ``detail`` is the start of that body. No httpx exception and
no JSON decoding error leaks out of the client.

==========================  =============================================
class                       when
==========================  =============================================
:class:`ValidationError`    400 / 422: the request is invalid (``errors`` names the fields); also
                            raised before sending for input the client can tell is bad (``status`` None)
:class:`AuthenticationError`  401: missing or wrong API key
:class:`PayloadTooLargeError` 413: body or estimated work over the server's limits
:class:`OverloadedError`    429 / 503: overloaded or not ready, after the retries ran out
:class:`ServerTimeoutError` 504: the server gave up on the request
:class:`TransportError`     no HTTP answer: connection refused or reset, client-side timeout
:class:`ServiceError`       any other status (404, 415, 500, ...)
==========================  =============================================
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = [
    "AuthenticationError",
    "OverloadedError",
    "PayloadTooLargeError",
    "ServerTimeoutError",
    "ServiceError",
    "TransportError",
    "ValidationError",
    "error_for_status",
    "invalid_input",
]

_BODY_EXCERPT = 500


class ServiceError(Exception):
    """A call that did not succeed. ``status`` is None when no HTTP answer came (``TransportError``)."""

    def __init__(
        self,
        status: int | None,
        problem: Mapping[str, Any],
        *,
        request_id: str | None = None,
        headers: Mapping[str, str] | None = None,
        retry_after: float | None = None,
    ) -> None:
        self.status = status
        self.problem: dict[str, Any] = dict(problem)
        self.type: str = str(problem.get("type", "about:blank"))
        self.title: str = str(problem.get("title", ""))
        self.detail: str = str(problem.get("detail", ""))
        raw_errors = problem.get("errors")
        self.errors: list[dict[str, Any]] = list(raw_errors) if isinstance(raw_errors, list) else []
        self.request_id = request_id
        self.headers: dict[str, str] = dict(headers or {})
        self.retry_after = retry_after
        where = f" (request id {request_id})" if request_id else ""
        head = f"{status} {self.title}".strip() if status is not None else self.title or "transport error"
        super().__init__(f"{head}: {self.detail}{where}" if self.detail else f"{head}{where}")


class ValidationError(ServiceError, ValueError):
    """400 or 422: the service refused the input; ``errors`` lists ``{"loc": [...], "msg": ...}``.

    Input the client can judge on its own (a ragged nested list, text where numbers belong, an
    option that is not a number) is refused before any request, with ``status`` None. It is a
    ``ValueError`` too, as numpy's error for such input was.
    """


class AuthenticationError(ServiceError):
    """401: the service needs an API key, or refused the one sent."""


class PayloadTooLargeError(ServiceError):
    """413: the body or the estimated work is over the server's limits."""


class OverloadedError(ServiceError):
    """429 or 503: overloaded or not ready; raised once the retries are spent (``retry_after`` from the answer)."""


class ServerTimeoutError(ServiceError):
    """504: the request was not answered within the server's time limit."""


class TransportError(ServiceError):
    """No HTTP answer: the connection failed or broke, or the client-side timeout passed."""

    def __init__(self, message: str, *, timed_out: bool = False) -> None:
        super().__init__(None, {"title": "transport error", "detail": message})
        self.timed_out = timed_out


def invalid_input(field: str, message: str) -> ValidationError:
    """The error for bad input caught before sending (no status, no request id); ``field`` names the argument."""
    return ValidationError(
        None,
        {
            "type": "about:blank",
            "title": "invalid input",
            "detail": f"{field}: {message}",
            "errors": [{"loc": [field], "msg": message, "type": "client_validation"}],
        },
    )


_BY_STATUS: dict[int, type[ServiceError]] = {
    400: ValidationError,
    422: ValidationError,
    401: AuthenticationError,
    413: PayloadTooLargeError,
    429: OverloadedError,
    503: OverloadedError,
    504: ServerTimeoutError,
}


def problem_from_body(status: int, reason: str, content_type: str, body: bytes, parsed: Any) -> dict[str, Any]:
    """The problem fields of an error answer: the JSON object itself (problem+json, or /v2's ``{"error"}``),
    else a problem built from the status and the start of the body.
    """
    if isinstance(parsed, dict):
        problem = dict(parsed)
        if "detail" not in problem and isinstance(problem.get("error"), str):
            problem["detail"] = problem["error"]
        problem.setdefault("status", status)
        problem.setdefault("title", reason)
        return problem
    text = body[:_BODY_EXCERPT].decode("utf-8", "replace").strip()
    detail = text or f"empty {content_type or 'body'}"
    return {"type": "about:blank", "title": reason, "status": status, "detail": detail}


def error_for_status(
    status: int,
    problem: Mapping[str, Any],
    *,
    request_id: str | None = None,
    headers: Mapping[str, str] | None = None,
    retry_after: float | None = None,
) -> ServiceError:
    """The exception of the class that matches ``status``."""
    cls = _BY_STATUS.get(status, ServiceError)
    return cls(status, problem, request_id=request_id, headers=headers, retry_after=retry_after)
