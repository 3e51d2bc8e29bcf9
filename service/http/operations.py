"""Operational endpoints: liveness, readiness, engines and models."""

from __future__ import annotations

import time
from typing import Any

from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response

from service import __version__
from service.dataplane.runtime import Runtime
from service.engines.base import runs_graphs
from service.http.responses import json_response
from service.http.routing import RawRoute

READYZ_RESPONSES: dict[int | str, dict[str, Any]] = {
    503: {
        "description": "Not ready (Retry-After); the body says which engine and why",
        "content": {
            "application/json": {
                "schema": {"type": "object", "additionalProperties": True},
                "example": {"ready": False, "starting": True, "engines": {"numpy": True}, "status": "not ready"},
            }
        },
    }
}


def routes(runtime: Runtime) -> list[APIRoute]:
    """/healthz, /readyz (GET and HEAD), /v1/engines and /v1/models, bound to ``runtime``."""

    async def healthz(request: Request) -> Response:
        return json_response(
            {"status": "ok", "version": __version__, "uptime_s": round(time.time() - runtime.started_at, 3)}
        )

    async def readyz(request: Request) -> Response:
        ready, details = runtime.readiness()
        details["status"] = ("degraded" if details.get("degraded") else "ready") if ready else "not ready"
        headers = None if ready else {"Retry-After": "5"}
        return json_response(details, status_code=200 if ready else 503, headers=headers)

    async def engines(request: Request) -> Response:
        _, details = runtime.readiness()
        required = runtime.required_engines
        failed = details.get("failed", {})
        described = [
            {**engine.describe(), "required": name in required, **({"failure": failed[name]} if name in failed else {})}
            for name, engine in runtime.engines.items()
        ]
        return json_response({"engines": described, "degraded": details["degraded"], "failed": failed})

    async def models(request: Request) -> Response:
        onnx = runtime.engines.get("onnx")
        if not runs_graphs(onnx):
            return json_response({"models": [], "detail": "the ONNX engine is disabled"})
        return json_response(onnx.models())

    def route(path: str, endpoint: Any, summary: str, **docs: Any) -> APIRoute:
        return RawRoute(path, endpoint, methods=["GET"], tags=["operations"], summary=summary, **docs)

    return [
        route("/healthz", healthz, "Liveness: the process answers"),
        route(
            "/readyz",
            readyz,
            "Readiness: every required engine loaded and warmed up (503 until then); degraded when another failed",
            responses=READYZ_RESPONSES,
        ),
        route("/v1/engines", engines, "Engines, ONNX Runtime providers and versions"),
        route("/v1/models", models, "The exported ONNX graphs in models/ and whether their hashes verified"),
        # HEAD on the probes (load balancers and uptime checkers often probe with it): the status and headers of
        # the GET answer, no body (the server drops it). Left out of the schema: one operation per route there.
        RawRoute("/healthz", healthz, methods=["HEAD"], include_in_schema=False),
        RawRoute("/readyz", readyz, methods=["HEAD"], include_in_schema=False),
    ]
