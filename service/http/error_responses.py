"""Error answers over HTTP: RFC 9457 ``application/problem+json`` everywhere, the Open Inference Protocol's
``{"error": message}`` under /v2, the status each kind of :class:`~service.dataplane.errors.ServiceError` gets in
each, and the app's handlers that answer every error a request can raise (the front end's own refusals are
:mod:`service.http.errors`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from service.dataplane.errors import (
    ANSWERABLE,
    OIP_REMEDY_WORDS,
    FieldError,
    Kind,
    ServiceError,
    as_service_error,
    phrased,
)
from service.http.errors import ProblemError, Refused, pydantic_errors, summarize

PROBLEM_MEDIA_TYPE = "application/problem+json"
PROBLEM_TYPE_BASE = "https://attention-service.dev/problems/"

TITLES = {
    400: "Bad request",
    401: "Unauthorized",
    404: "Not found",
    405: "Method not allowed",
    408: "Request timeout",
    413: "Request too large",
    415: "Unsupported media type",
    422: "Invalid input",
    500: "Internal server error",
    503: "Service unavailable",
    504: "Request timed out",
}

SLUGS = {
    400: "bad-request",
    401: "unauthorized",
    404: "not-found",
    405: "method-not-allowed",
    408: "request-timeout",
    413: "too-large",
    415: "unsupported-media-type",
    422: "invalid-input",
    500: "internal-error",
    503: "unavailable",
    504: "timeout",
}

STATUS = {Kind.INVALID: 422, Kind.NOT_FOUND: 404, Kind.TOO_LARGE: 413, Kind.UNAVAILABLE: 503, Kind.TIMEOUT: 504}
"""The status of each kind of service error; /v2 answers ``INVALID`` with 400 (:data:`V2_STATUS`)."""
V2_STATUS = {**STATUS, Kind.INVALID: 400}

V2_PREFIX = "/v2"


def retry_headers(exc: ServiceError) -> dict[str, str] | None:
    return None if exc.retry_after_s is None else {"Retry-After": str(exc.retry_after_s)}


def problem_response(
    status: int,
    detail: str,
    *,
    errors: Sequence[FieldError] | None = None,
    headers: Mapping[str, str] | None = None,
    title: str | None = None,
) -> Response:
    """The problem+json answer of ``status``."""
    body: dict[str, Any] = {
        "type": PROBLEM_TYPE_BASE + SLUGS.get(status, str(status)),
        "title": title or TITLES.get(status, "Error"),
        "status": status,
        "detail": detail,
    }
    if errors is not None:
        body["errors"] = list(errors)
    return Response(
        orjson.dumps(body), status_code=status, media_type=PROBLEM_MEDIA_TYPE, headers=dict(headers or {}) or None
    )


def protocol_error_response(status: int, message: str, headers: Mapping[str, str] | None = None) -> Response:
    """The Open Inference Protocol's error object ``{"error": message}`` (the /v2 routes' error body)."""
    return Response(
        orjson.dumps({"error": message}), status_code=status, media_type="application/json", headers=dict(headers or {})
    )


def is_v2(path: str) -> bool:
    return path == V2_PREFIX or path.startswith(V2_PREFIX + "/")


def error_response(
    path: str,
    status: int,
    detail: str,
    *,
    errors: Sequence[FieldError] | None = None,
    headers: dict[str, str] | None = None,
) -> Response:
    """The error body of the protocol the path belongs to (for answers given before routing: the edge's
    401/413/503/504): ``{"error": detail}`` under /v2, problem+json everywhere else.
    """
    if is_v2(path):
        return protocol_error_response(status, detail, headers)
    return problem_response(status, detail, errors=errors, headers=headers)


def app_path(scope: Mapping[str, Any]) -> str:
    """The request path inside the app (without a ``root_path`` the server was mounted under)."""
    path: str = scope.get("path", "")
    root = scope.get("root_path", "")
    if root and path.startswith(root):
        return path[len(root) :] or "/"
    return path


def v2_error(exc: BaseException) -> Response | None:
    """The /v2 answer to a request error (None for anything else: a bug, left to the 500 handling)."""
    error = as_service_error(exc)
    if error is not None:
        message = phrased(error, OIP_REMEDY_WORDS)  # /v2 has no precision: the remedy is the FP64 datatype
        return protocol_error_response(V2_STATUS[error.kind], message, retry_headers(error))
    if isinstance(exc, ProblemError):
        return protocol_error_response(400 if exc.status == 422 else exc.status, exc.detail, exc.headers)
    if isinstance(exc, StarletteHTTPException):  # e.g. the body-size limit met while the body is read
        detail = exc.detail if isinstance(exc.detail, str) else "error"
        return protocol_error_response(exc.status_code, detail, exc.headers)
    return None


V2_ERRORS = (*ANSWERABLE, ProblemError, StarletteHTTPException)
"""What a /v2 request can be refused with (:func:`v2_error`)."""


def install_error_handlers(app: FastAPI) -> None:
    """Answer every error the app can raise as problem+json."""

    async def on_service_error(request: Request, exc: Exception) -> Response:
        if isinstance(exc, Refused):
            metrics = getattr(request.app.state, "metrics", None)
            if metrics is not None:
                metrics.refused(exc.reason)
        error = as_service_error(exc)
        assert error is not None
        return problem_response(STATUS[error.kind], error.message, errors=error.errors, headers=retry_headers(error))

    async def on_problem(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ProblemError)
        return problem_response(exc.status, exc.detail, errors=exc.errors, headers=exc.headers)

    async def on_request_validation(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        errors = pydantic_errors(exc)
        return problem_response(422, summarize(errors), errors=errors)

    async def on_http(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        detail = exc.detail if isinstance(exc.detail, str) else TITLES.get(exc.status_code, "Error")
        return error_response(app_path(request.scope), exc.status_code, detail, headers=dict(exc.headers or {}))

    for kind in ANSWERABLE:
        app.add_exception_handler(kind, on_service_error)
    app.add_exception_handler(ProblemError, on_problem)
    app.add_exception_handler(RequestValidationError, on_request_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
