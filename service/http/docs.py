"""The OpenAPI schema and the pages that show it.

- :func:`install_openapi`: the request bodies that routes parse themselves, the Open
  Inference Protocol objects, and (wrapping the app's schema last) examples on every
  request and answer, response schemas of the operational endpoints, the API-key
  security schemes, and no error status a route never sends;
- :func:`install_docs`: ``/docs`` (Swagger UI) and ``/redoc`` from assets shipped in the
  ``fastapi-offline`` package (FastAPI's "self-hosting JavaScript and CSS for docs"
  recipe), so they work on a cluster without internet access.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import fastapi_offline  # Swagger UI and ReDoc assets (its static/ folder)
from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.openapi.utils import get_openapi
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel
from starlette.responses import HTMLResponse
from starlette.routing import BaseRoute

from service.http import examples
from service.http.error_responses import PROBLEM_TYPE_BASE, SLUGS, TITLES, V2_PREFIX
from service.http.v1.schemas import TENSOR_COMPONENTS

HTTP_METHODS = frozenset({"get", "put", "post", "delete", "options", "head", "patch", "trace"})
DOCS_ASSETS = "/docs/assets"
DOCS_CSP = (
    "default-src 'none'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; font-src 'self' data:; connect-src 'self'; worker-src 'self' blob:; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
"""The docs pages' own policy: their assets and the schema come from this server only (no CDN)."""

SECURITY_SCHEMES: dict[str, Any] = {
    "bearer": {
        "type": "http",
        "scheme": "bearer",
        "description": "An API key (ATTN_API_KEYS) as 'Authorization: Bearer <key>'.",
    },
    "apiKey": {"type": "apiKey", "in": "header", "name": "X-API-Key", "description": "An API key as 'X-API-Key'."},
}

_OBJECT = {"type": "object", "additionalProperties": True}
RESPONSE_SCHEMAS: dict[str, dict[str, Any]] = {
    "healthz": {
        "type": "object",
        "required": ["status", "version", "uptime_s"],
        "properties": {"status": {"type": "string"}, "version": {"type": "string"}, "uptime_s": {"type": "number"}},
    },
    "readyz": _OBJECT,
    "engines": {
        "type": "object",
        "required": ["engines"],
        "properties": {"engines": {"type": "array", "items": _OBJECT}},
    },
    "models": _OBJECT,
    "server_metadata": {"$ref": "#/components/schemas/ServerMetadata"},
    "server_live": {"$ref": "#/components/schemas/ServerLive"},
    "server_ready": {"$ref": "#/components/schemas/ServerReady"},
    "model_ready": {"$ref": "#/components/schemas/ModelReady"},
    "model_version_ready": {"$ref": "#/components/schemas/ModelReady"},
    "model_metadata": {"$ref": "#/components/schemas/ModelMetadata"},
    "model_version_metadata": {"$ref": "#/components/schemas/ModelMetadata"},
}
"""Schemas of the 200 answers of routes that write their JSON themselves (no response model)."""


def problem_example(status: int) -> dict[str, Any]:
    """An example problem+json body of ``status``, with the service's own ``type`` and ``title``."""
    body: dict[str, Any] = {
        "type": PROBLEM_TYPE_BASE + SLUGS.get(status, str(status)),
        "title": TITLES.get(status, "Error"),
        "status": status,
        "detail": examples.PROBLEM_DETAILS.get(status, TITLES.get(status, "Error")),
    }
    if status in examples.PROBLEM_ERRORS:
        body["errors"] = examples.PROBLEM_ERRORS[status]
    return body


def _add_components(schema: dict[str, Any], models: list[type[BaseModel]]) -> None:
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for model in models:
        model_schema = model.model_json_schema(ref_template="#/components/schemas/{model}", by_alias=True)
        for name, definition in model_schema.pop("$defs", {}).items():
            components.setdefault(name, definition)
        components[model.__name__] = model_schema


def install_openapi(app: FastAPI, routes: list[BaseRoute], request_models: list[type[BaseModel]]) -> None:
    """Make ``app.openapi()`` document ``routes`` in their order, with ``request_models`` (bodies that routes
    parse themselves) as components.
    """

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = get_openapi(
            title=app.title,
            version=app.version,
            description=app.description,
            routes=routes,
            tags=app.openapi_tags,
        )
        _add_components(schema, request_models)
        schema["components"]["schemas"].update(TENSOR_COMPONENTS)
        app.openapi_schema = schema
        return schema

    # Replacing app.openapi is FastAPI's documented way to extend the schema; mypy forbids assigning to a method.
    app.openapi = openapi  # type: ignore[method-assign]


def finish_openapi(app: FastAPI) -> None:
    """Wrap ``app.openapi`` (call after everything else that documents answers, e.g. the middleware) to add
    examples, operational response schemas and the security schemes, and to drop answers never sent.
    """
    build = app.openapi
    done: list[dict[str, Any]] = []

    def openapi() -> dict[str, Any]:
        if not done:
            schema = build()
            polish(schema)
            app.openapi_schema = schema
            done.append(schema)
        return done[0]

    # FastAPI documents replacing app.openapi ("Extending OpenAPI"); mypy sees a method assignment.
    app.openapi = openapi  # type: ignore[method-assign]


def polish(schema: dict[str, Any]) -> None:
    """The finishing pass over the schema (see :func:`finish_openapi`)."""
    components = schema.setdefault("components", {})
    components.setdefault("securitySchemes", {}).update(SECURITY_SCHEMES)
    for path, item in schema.get("paths", {}).items():
        for method, operation in item.items():
            if method in HTTP_METHODS:
                _polish_operation(path, operation)
    _drop_unused_validation_components(schema)


def _polish_operation(path: str, operation: dict[str, Any]) -> None:
    op_id = operation.get("operationId", "")
    responses: dict[str, Any] = operation.setdefault("responses", {})
    validation = responses.get("422", {}).get("content", {}).get("application/json", {}).get("schema", {})
    if validation.get("$ref", "").endswith("/HTTPValidationError"):
        del responses["422"]  # FastAPI's parameter validation: these routes read their parameters themselves
    body = operation.get("requestBody", {}).get("content", {}).get("application/json")
    if body is not None and op_id in examples.REQUEST_EXAMPLES:
        body["example"] = examples.REQUEST_EXAMPLES[op_id]
    for status, response in responses.items():
        content: dict[str, Any] = response.get("content", {})
        if status.startswith("2"):
            _polish_success(op_id, content)
            continue
        code = int(status)
        for media_type, media in content.items():
            if media_type == "application/problem+json":
                media.setdefault("schema", {"$ref": "#/components/schemas/Problem"})
                media.setdefault("example", problem_example(code))
            elif media_type == "application/json" and path.startswith(V2_PREFIX):
                media["schema"] = {"$ref": "#/components/schemas/ProtocolError"}  # one model, not one per answer
                media.setdefault("example", examples.V2_ERROR_EXAMPLES.get(code, {"error": TITLES.get(code, "")}))


def _polish_success(op_id: str, content: dict[str, Any]) -> None:
    json_media = content.get("application/json")
    if json_media is not None:
        if op_id in RESPONSE_SCHEMAS and not json_media.get("schema"):
            json_media["schema"] = RESPONSE_SCHEMAS[op_id]
        if op_id in examples.RESPONSE_EXAMPLES:
            json_media["example"] = examples.RESPONSE_EXAMPLES[op_id]
    text = content.get("text/plain")
    if text is not None and op_id == "metrics":
        text["example"] = examples.METRICS_EXAMPLE


def _drop_unused_validation_components(schema: dict[str, Any]) -> None:
    """FastAPI's HTTPValidationError/ValidationError, once no answer refers to them."""
    components = schema.get("components", {}).get("schemas", {})
    text = json.dumps(schema.get("paths", {}))
    if "#/components/schemas/HTTPValidationError" not in text:
        components.pop("HTTPValidationError", None)
        rest = json.dumps(components)
        if "#/components/schemas/ValidationError" not in rest and "#/components/schemas/ValidationError" not in text:
            components.pop("ValidationError", None)


# --------------------------------------------------------------------------- pages


def _assets_dir() -> str:
    return str(Path(fastapi_offline.__file__).parent / "static")


def install_docs(app: FastAPI) -> None:
    """``/docs``, ``/docs/oauth2-redirect`` and ``/redoc`` with the assets under ``/docs/assets`` (create the
    app with ``docs_url=None, redoc_url=None``).
    """
    app.mount(DOCS_ASSETS, StaticFiles(directory=_assets_dir()), name="docs-assets")
    headers = {"Content-Security-Policy": DOCS_CSP}

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        page = get_swagger_ui_html(
            openapi_url=f"{root}{app.openapi_url}",
            title=f"{app.title} - Swagger UI",
            oauth2_redirect_url=f"{root}/docs/oauth2-redirect",
            swagger_js_url=f"{root}{DOCS_ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{DOCS_ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{root}{DOCS_ASSETS}/favicon.png",
        )
        page.headers.update(headers)
        return page

    @app.get("/docs/oauth2-redirect", include_in_schema=False)
    async def swagger_ui_redirect() -> HTMLResponse:
        page = get_swagger_ui_oauth2_redirect_html()
        page.headers.update(headers)
        return page

    @app.get("/redoc", include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        page = get_redoc_html(
            openapi_url=f"{root}{app.openapi_url}",
            title=f"{app.title} - ReDoc",
            redoc_js_url=f"{root}{DOCS_ASSETS}/redoc.standalone.js",
            redoc_favicon_url=f"{root}{DOCS_ASSETS}/favicon.png",
            with_google_fonts=False,
        )
        page.headers.update(headers)
        return page
