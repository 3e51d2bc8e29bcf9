"""OpenAPI additions: schemas of request bodies that routes parse themselves.

The /v1 routes read the raw body (orjson, no per-element validation of large
arrays), so FastAPI does not see their request models; this adds them under
``components/schemas`` where the routes' ``openapi_extra`` refers to them.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel


def install_openapi(app: FastAPI, request_models: list[type[BaseModel]]) -> None:
    """Make ``app.openapi()`` include ``request_models`` as components."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = get_openapi(
            title=app.title,
            version=app.version,
            description=app.description,
            routes=app.routes,
            tags=app.openapi_tags,
        )
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        for model in request_models:
            model_schema = model.model_json_schema(ref_template="#/components/schemas/{model}", by_alias=True)
            for name, definition in model_schema.pop("$defs", {}).items():
                components.setdefault(name, definition)
            components[model.__name__] = model_schema
        app.openapi_schema = schema
        return schema

    # Replacing app.openapi is FastAPI's documented way to extend the schema; mypy forbids assigning to a method.
    app.openapi = openapi  # type: ignore[method-assign]
