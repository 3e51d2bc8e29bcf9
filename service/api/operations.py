"""Operational endpoints: liveness, readiness, engines and models."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request
from starlette.responses import Response

from service import __version__
from service.api.wire import json_response
from service.runtime import Runtime

router = APIRouter(tags=["operations"])


def _runtime(request: Request) -> Runtime:
    runtime: Runtime = request.app.state.runtime
    return runtime


@router.get("/healthz", summary="Liveness: the process answers")
async def healthz(request: Request) -> Response:
    runtime = _runtime(request)
    return json_response(
        {"status": "ok", "version": __version__, "uptime_s": round(time.time() - runtime.started_at, 3)}
    )


@router.get(
    "/readyz",
    summary="Readiness: every required engine loaded and warmed up (503 until then); degraded when another failed",
    responses={
        503: {
            "description": "Not ready (Retry-After); the body says which engine and why",
            "content": {
                "application/json": {
                    "schema": {"type": "object", "additionalProperties": True},
                    "example": {"ready": False, "starting": True, "engines": {"numpy": True}, "status": "not ready"},
                }
            },
        }
    },
)
async def readyz(request: Request) -> Response:
    ready, details = _runtime(request).readiness()
    details["status"] = ("degraded" if details.get("degraded") else "ready") if ready else "not ready"
    return json_response(details, status_code=200 if ready else 503, headers=None if ready else {"Retry-After": "5"})


@router.get("/v1/engines", summary="Engines, ONNX Runtime providers and versions")
async def engines(request: Request) -> Response:
    runtime = _runtime(request)
    _, details = runtime.readiness()
    required = runtime.required_engines
    failed = details.get("failed", {})
    described = [
        {**engine.describe(), "required": name in required, **({"failure": failed[name]} if name in failed else {})}
        for name, engine in runtime.engines.items()
    ]
    return json_response({"engines": described, "degraded": details["degraded"], "failed": failed})


@router.get("/v1/models", summary="The exported ONNX graphs in models/ and whether their hashes verified")
async def models(request: Request) -> Response:
    runtime = _runtime(request)
    onnx = runtime.engines.get("onnx")
    describe_models = getattr(onnx, "models", None)
    if describe_models is None:
        return json_response({"models": [], "detail": "the ONNX engine is disabled"})
    return json_response(describe_models())


# HEAD on the probes (load balancers and uptime checkers often probe with it): the status and headers of the
# GET answer, no body (the server drops it). Left out of the schema: one operation per route there.
for _path, _endpoint in (("/healthz", healthz), ("/readyz", readyz)):
    router.add_api_route(_path, _endpoint, methods=["HEAD"], include_in_schema=False)
