"""Documents in the OpenAPI schema the answers the edge can give on every operation."""

from __future__ import annotations

import copy
from typing import Any

from fastapi import FastAPI

from service.http.edge.requests import OPERATIONAL_PATHS
from service.http.error_responses import is_v2
from service.http.v1.schemas import Problem
from service.settings import Settings

HTTP_METHODS = frozenset({"get", "put", "post", "delete", "options", "head", "patch", "trace"})
V2_ERROR_SCHEMA = {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}}}
RETRY_AFTER = {"Retry-After": {"description": "Seconds to wait before retrying", "schema": {"type": "integer"}}}


def _error(description: str, v2: bool, headers: dict[str, Any] | None = None) -> dict[str, Any]:
    """One response object; a fresh copy each time, so the YAML rendering has no anchors."""
    content = (
        {"application/json": {"schema": V2_ERROR_SCHEMA}}
        if v2
        else {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}}
    )
    response: dict[str, Any] = {"description": description, "content": content}
    if headers:
        response["headers"] = headers
    return copy.deepcopy(response)


def add_error_responses(schema: dict[str, Any], settings: Settings) -> None:
    """Add 401/413/500/503/504 to each operation that can answer them (existing entries are kept)."""
    components = schema.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    if "Problem" not in schemas:
        schemas["Problem"] = Problem.model_json_schema(ref_template="#/components/schemas/{model}")
    if settings.api_keys:
        components.setdefault("securitySchemes", {}).update(
            {
                "bearer": {"type": "http", "scheme": "bearer"},
                "apiKey": {"type": "apiKey", "in": "header", "name": "X-API-Key"},
            }
        )
    for path, item in schema.get("paths", {}).items():
        v2 = is_v2(path)
        for method, operation in item.items():
            if method not in HTTP_METHODS:
                continue
            responses = operation.setdefault("responses", {})
            if settings.api_keys and path not in settings.auth_exempt_paths:
                operation.setdefault("security", [{"bearer": []}, {"apiKey": []}])
                responses.setdefault(
                    "401", _error("Missing or wrong API key", v2, {"WWW-Authenticate": {"schema": {"type": "string"}}})
                )
            if "requestBody" in operation:
                responses.setdefault(
                    "413", _error("Request too large (body over ATTN_MAX_BODY_BYTES, or estimated work)", v2)
                )
            if path not in OPERATIONAL_PATHS:
                responses.setdefault(
                    "503", _error("Overloaded: too many requests in flight (Retry-After)", v2, RETRY_AFTER)
                )
            responses.setdefault("504", _error("Not answered within ATTN_REQUEST_TIMEOUT_S", v2))
            responses.setdefault("500", _error("Unexpected server error (logged with the request id; no details)", v2))


def document_error_responses(app: FastAPI, settings: Settings) -> None:
    """Make ``app.openapi()`` include the edge's answers (wraps the current ``app.openapi``)."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = build()
            add_error_responses(schema, settings)
            app.openapi_schema = schema
        return app.openapi_schema

    # Replacing app.openapi is FastAPI's documented way to extend the schema; mypy forbids assigning to a method.
    app.openapi = openapi  # type: ignore[method-assign]
