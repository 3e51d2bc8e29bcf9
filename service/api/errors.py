"""Error mapping: every failure becomes an RFC 9457 ``application/problem+json`` body (api.md, "Errors")."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from service.core.errors import InvalidInput, NumericalError

PROBLEM_MEDIA_TYPE = "application/problem+json"
PROBLEM_TYPE_BASE = "https://attention-service.dev/problems/"

logger = logging.getLogger("service.api")

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


class ProblemError(Exception):
    """An error answered as a problem+json body with the given status."""

    def __init__(
        self,
        status: int,
        detail: str,
        *,
        errors: Sequence[dict[str, Any]] | None = None,
        headers: dict[str, str] | None = None,
        title: str | None = None,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.errors = list(errors) if errors is not None else None
        self.headers = headers or {}
        self.title = title


def invalid(detail: str, loc: Sequence[str | int] = ()) -> ProblemError:
    """A 422 naming the offending field."""
    return ProblemError(422, detail, errors=[{"loc": list(loc), "msg": detail}])


def problem_response(
    status: int,
    detail: str,
    *,
    errors: Sequence[dict[str, Any]] | None = None,
    headers: dict[str, str] | None = None,
    title: str | None = None,
    instance: str | None = None,
) -> Response:
    """Build the problem+json response for a status."""
    body: dict[str, Any] = {
        "type": PROBLEM_TYPE_BASE + SLUGS.get(status, str(status)),
        "title": title or TITLES.get(status, "Error"),
        "status": status,
        "detail": detail,
    }
    if instance:
        body["instance"] = instance
    if errors is not None:
        body["errors"] = list(errors)
    return Response(orjson.dumps(body), status_code=status, media_type=PROBLEM_MEDIA_TYPE, headers=headers)


V2_PREFIX = "/v2"


def app_path(scope: Mapping[str, Any]) -> str:
    """The request path inside the app (without a ``root_path`` the server was mounted under)."""
    path: str = scope.get("path", "")
    root = scope.get("root_path", "")
    if root and path.startswith(root):
        return path[len(root) :] or "/"
    return path


def protocol_error_response(status: int, message: str, headers: Mapping[str, str] | None = None) -> Response:
    """The Open Inference Protocol's error object ``{"error": message}`` (the /v2 routes' error body)."""
    return Response(
        orjson.dumps({"error": message}), status_code=status, media_type="application/json", headers=dict(headers or {})
    )


def error_response(
    path: str,
    status: int,
    detail: str,
    *,
    errors: Sequence[dict[str, Any]] | None = None,
    headers: dict[str, str] | None = None,
) -> Response:
    """The error body the path's protocol defines: ``{"error": detail}`` under /v2 (Open
    Inference Protocol), problem+json everywhere else; same status and headers either way.
    """
    if path == V2_PREFIX or path.startswith(V2_PREFIX + "/"):
        return protocol_error_response(status, detail, headers)
    return problem_response(status, detail, errors=errors, headers=headers)


def pydantic_errors(
    exc: ValidationError | RequestValidationError, prefix: Sequence[str | int] = ()
) -> list[dict[str, Any]]:
    """Pydantic's errors as ``{"loc", "msg"}`` pairs, with no input echoed back."""
    out = []
    for err in exc.errors():
        loc = [p for p in err.get("loc", ()) if p not in ("body",)]
        out.append({"loc": [*prefix, *loc], "msg": str(err.get("msg", "invalid value"))})
    return out


def summarize(errors: Sequence[dict[str, Any]]) -> str:
    """One line that names each failing field."""
    parts = []
    for err in errors[:5]:
        where = ".".join(str(p) for p in err["loc"]) or "body"
        parts.append(f"{where}: {err['msg']}")
    more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
    return "; ".join(parts) + more


def install_error_handlers(app: FastAPI) -> None:
    """Answer every error the app can raise as problem+json."""

    async def on_problem(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ProblemError)
        return problem_response(exc.status, exc.detail, errors=exc.errors, headers=exc.headers, title=exc.title)

    async def on_invalid_input(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, InvalidInput)
        return problem_response(422, exc.message, errors=[{"loc": list(exc.loc), "msg": exc.message}])

    async def on_numerical(request: Request, exc: Exception) -> Response:
        return problem_response(422, str(exc), errors=[{"loc": [], "msg": str(exc)}])

    async def on_request_validation(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        errors = pydantic_errors(exc)
        return problem_response(422, summarize(errors), errors=errors)

    async def on_http(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        detail = exc.detail if isinstance(exc.detail, str) else TITLES.get(exc.status_code, "Error")
        return error_response(app_path(request.scope), exc.status_code, detail, headers=dict(exc.headers or {}))

    app.add_exception_handler(ProblemError, on_problem)
    app.add_exception_handler(InvalidInput, on_invalid_input)
    app.add_exception_handler(NumericalError, on_numerical)
    app.add_exception_handler(RequestValidationError, on_request_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
