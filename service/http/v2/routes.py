"""The Open Inference Protocol (KServe V2, as Triton and MLServer speak it) over REST, under /v2.

The models are the data plane's (:mod:`service.dataplane.models`); this module reads and writes their
wire form (:mod:`service.http.v2.tensors`: JSON ``data`` or the binary tensor data extension) and
answers the protocol's health and metadata routes, and Triton's statistics extension
(``/v2/models[/{name}[/versions/{version}]]/stats``, :mod:`service.dataplane.statistics`, which counts every
inference a ready model takes). Errors are the protocol's ``{"error": "..."}``: 400 for anything wrong with
the request (malformed or invalid; /v1 answers 422 for the latter), 404 for an unknown model or version, 413
over a size or work limit, 415 for an unknown Content-Encoding, 503 while the model is not ready (with
``Retry-After``).
"""

from __future__ import annotations

from typing import Any

import orjson
from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response

from service import __version__
from service.dataplane.context import NOT_READY_RETRY_AFTER_S
from service.dataplane.door import Call
from service.dataplane.errors import not_found as not_found_error
from service.dataplane.inference import InferRequest, InferResult
from service.dataplane.memory import MemoryLease
from service.dataplane.models import SERVER_NAME, find_model, server_extensions
from service.dataplane.models.unsupported import UNSUPPORTED, Unsupported
from service.dataplane.plane import DataPlane
from service.http.bodies import declared_length, read_body
from service.http.callers import request_caller
from service.http.routing import V2Route
from service.http.v2.codec import REST_CODEC, Body, Encoded
from service.http.v2.tensors import HEADER_LENGTH

ERROR_SCHEMA = {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}}}
RETRY = {"Retry-After": str(NOT_READY_RETRY_AFTER_S)}
JSON = "application/json"

ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"description": desc, "content": {"application/json": {"schema": ERROR_SCHEMA}}}
    for status, desc in (
        (400, "Malformed or invalid request"),
        (404, "Unknown model or version"),
        (413, "Request too large (body, inflated body, estimated work or response size)"),
        (415, "Unsupported Content-Encoding"),
        (503, "Model not ready"),
    )
}


INFER_OPENAPI: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "description": (
            "An Open Inference Protocol inference request: {id?, parameters?, inputs: [{name, shape, datatype, "
            "parameters?, data?}], outputs?: [{name, parameters?}]}. With the binary tensor data extension the JSON is "
            "followed by the raw little-endian row-major tensors of the inputs that have parameters.binary_data_size, "
            "and the Inference-Header-Content-Length header gives the JSON's length. Content-Encoding gzip or deflate "
            "is accepted."
        ),
        "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/InferenceRequest"}},
            "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
        },
    },
    "parameters": [
        {
            "name": "Inference-Header-Content-Length",
            "in": "header",
            "required": False,
            "schema": {"type": "integer", "minimum": 1},
            "description": "Length of the JSON part when binary tensor data follows it.",
        }
    ],
}
INFER_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": (
            "The inference response {model_name, model_version, id?, parameters, outputs}; application/octet-stream "
            "with Inference-Header-Content-Length when any output is binary"
        ),
        "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/InferenceResponse"}},
            "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
        },
    },
    **{k: ERROR_RESPONSES[k] for k in (400, 404, 413, 415, 503)},
}
STATS_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": (
            "Triton's statistics extension: {model_stats: [{name, version, last_inference, inference_count, "
            "execution_count, inference_stats: {success, fail, queue, compute_input, compute_infer, compute_output, "
            "cache_hit, cache_miss}, batch_stats}]}, each statistic {count, ns}, of every worker"
        ),
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ModelStatisticsResponse"}}},
    },
    404: ERROR_RESPONSES[404],
}


def routes(plane: DataPlane) -> list[APIRoute]:
    """The /v2 routes, bound to ``plane``."""
    runtime = plane.runtime

    async def server_metadata(request: Request) -> Response:
        return Response(
            orjson.dumps(
                {
                    "name": SERVER_NAME,
                    "version": __version__,
                    "extensions": server_extensions(plane.sessions is not None),
                }
            ),
            media_type=JSON,
        )

    async def server_live(request: Request) -> Response:
        return Response(b'{"live":true}', media_type=JSON)

    async def server_ready(request: Request) -> Response:
        reason = runtime.not_ready_reason()
        if reason is None:
            return Response(b'{"ready":true}', media_type=JSON)
        body = orjson.dumps({"ready": False, "error": reason})
        return Response(body, status_code=503, media_type=JSON, headers=RETRY)

    async def ready(name: str, version: str | None) -> Response:
        model = find_model(name, version)
        reason = runtime.not_ready_reason()
        body: dict[str, Any] = {"name": model.name, "ready": reason is None}
        if reason is None:
            return Response(orjson.dumps(body), media_type=JSON)
        body["error"] = f"model {model.name!r} is not ready: {reason}"
        return Response(orjson.dumps(body), status_code=503, media_type=JSON, headers=RETRY)

    async def model_ready(request: Request, model_name: str) -> Response:
        return await ready(model_name, None)

    async def model_version_ready(request: Request, model_name: str, model_version: str) -> Response:
        return await ready(model_name, model_version)

    async def model_metadata(request: Request, model_name: str) -> Response:
        return Response(orjson.dumps(find_model(model_name).metadata()), media_type=JSON)

    async def model_version_metadata(request: Request, model_name: str, model_version: str) -> Response:
        return Response(orjson.dumps(find_model(model_name, model_version).metadata()), media_type=JSON)

    async def run(request: Request, name: str, version: str | None) -> Response:
        async def read(lease: MemoryLease) -> Body:  # JSON or octet-stream
            data = await read_body(request, plane.settings.max_body_bytes, json_only=False, lease=lease)
            return Body(data, request.headers.get(HEADER_LENGTH))

        call: Call[Body, InferRequest, InferResult, Encoded] = Call(
            read=read,
            size=lambda body: len(body.data),
            codec=REST_CODEC,
            operation=find_model(name, version),
            declared_bytes=declared_length(request),
            caller=request_caller(plane, request),
        )
        content, headers, media_type = await plane.door.serve(call)
        return Response(content, media_type=media_type, headers=headers)

    def stats(name: str, version: str) -> Response:
        return Response(orjson.dumps(plane.statistics.report(name, version)), media_type=JSON)

    async def all_model_statistics(request: Request) -> Response:
        return stats("", "")

    async def model_statistics(request: Request, model_name: str) -> Response:
        return stats(model_name, "")

    async def model_version_statistics(request: Request, model_name: str, model_version: str) -> Response:
        return stats(model_name, model_version)

    async def infer(request: Request, model_name: str) -> Response:
        """Run a model. JSON or binary tensors in and out; options in the request parameters; diagnostics in the response parameters."""  # noqa: E501 -- the docstring is the endpoint's OpenAPI description: one line keeps openapi.yaml as it is
        return await run(request, model_name, None)

    async def infer_version(request: Request, model_name: str, model_version: str) -> Response:
        """As ``/v2/models/{model_name}/infer``, for an explicit version (``1``)."""
        return await run(request, model_name, model_version)

    def route(path: str, endpoint: Any, method: str = "GET", **docs: Any) -> APIRoute:
        return V2Route("/v2" + path, endpoint, methods=[method], tags=["open inference protocol"], **docs)

    not_found = {404: ERROR_RESPONSES[404]}
    return unsupported_routes() + [
        route("", server_metadata, summary="Server metadata: name, version, extensions"),
        route("/health/live", server_live, summary="Server liveness"),
        route(
            "/health/ready",
            server_ready,
            summary="Server readiness (503 until every engine is ready)",
            responses={503: ERROR_RESPONSES[503]},
        ),
        # HEAD on the health routes, like /healthz and /readyz; not in the schema.
        route("/health/live", server_live, "HEAD", include_in_schema=False),
        route("/health/ready", server_ready, "HEAD", include_in_schema=False),
        route(
            "/models/{model_name}/ready",
            model_ready,
            summary="Model readiness",
            responses={k: ERROR_RESPONSES[k] for k in (404, 503)},
        ),
        route(
            "/models/{model_name}/versions/{model_version}/ready",
            model_version_ready,
            summary="Model readiness (one version)",
            responses={k: ERROR_RESPONSES[k] for k in (404, 503)},
        ),
        # Ahead of /models/{model_name}, so that /models/stats is not taken for a model.
        route(
            "/models/stats",
            all_model_statistics,
            summary="Inference statistics of every model (statistics extension)",
            responses=STATS_RESPONSES,
        ),
        route(
            "/models/{model_name}/stats",
            model_statistics,
            summary="Inference statistics of one model (statistics extension)",
            responses=STATS_RESPONSES,
        ),
        route(
            "/models/{model_name}/versions/{model_version}/stats",
            model_version_statistics,
            summary="Inference statistics of one model version (statistics extension)",
            responses=STATS_RESPONSES,
        ),
        route(
            "/models/{model_name}",
            model_metadata,
            summary="Model metadata: inputs, outputs and parameters",
            responses=not_found,
        ),
        route(
            "/models/{model_name}/versions/{model_version}",
            model_version_metadata,
            summary="Model metadata (one version)",
            responses=not_found,
        ),
        route(
            "/models/{model_name}/infer",
            infer,
            "POST",
            summary="Inference",
            responses=INFER_RESPONSES,
            openapi_extra=INFER_OPENAPI,
        ),
        route(
            "/models/{model_name}/versions/{model_version}/infer",
            infer_version,
            "POST",
            summary="Inference (one version)",
            responses=INFER_RESPONSES,
            openapi_extra=INFER_OPENAPI,
        ),
    ]


def unsupported_routes() -> list[APIRoute]:
    """The protocol's extensions this server does not serve: 404 with the protocol's error body naming the
    extension (:mod:`service.dataplane.models.unsupported`), ahead of the model routes. Left out of the schema.
    """

    def endpoint(extension: Unsupported) -> Any:
        async def refuse(request: Request, **path: str) -> Response:
            raise not_found_error(extension.message())

        return refuse

    return [
        V2Route("/v2" + path, endpoint(extension), methods=[method], include_in_schema=False)
        for extension in UNSUPPORTED
        for method, path in extension.rest
    ]
