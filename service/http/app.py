"""The REST front end's application: one route table over the data plane, the edge around it, the pages.

:func:`build_app` builds the FastAPI app; :func:`route_table` lists every route in the order the OpenAPI
schema documents them (requests are matched against the inference routes first).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

from fastapi import FastAPI
from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response

from service import __version__
from service.dataplane.plane import DataPlane
from service.http import operations
from service.http.docs import finish_openapi, install_docs, install_openapi
from service.http.edge import install_edge
from service.http.error_responses import install_error_handlers
from service.http.responses import GZipIfAccepted
from service.http.routing import RawRoute
from service.http.tracing import install_tracing
from service.http.v1 import attention as v1_attention
from service.http.v1 import logits as v1_logits
from service.http.v1 import rollout as v1_rollout
from service.http.v1 import sessions as v1_sessions
from service.http.v1.gradient_schemas import AnalyzeRequest, AttentionBackwardRequest
from service.http.v1.logits_schemas import CalibrateRequest, SampleRequest
from service.http.v1.rollout_schemas import RolloutRequest
from service.http.v1.schemas import AttentionRequest, SoftmaxRequest
from service.http.v1.session_schemas import SessionStepRequest
from service.http.v2 import routes as v2_routes
from service.http.v2.schemas import V2_MODELS
from service.observability.metrics import CONTENT_TYPE, ServiceMetrics
from service.playground import install_playground
from service.settings import Settings

DESCRIPTION = """\
Attention computed, inspected and served over HTTP.

Numerical contract: scores = scale * Q K^T, plus the mask bias (boolean masks select,
float masks add), divided by the temperature, normalized over the keys (softmax, sparsemax,
entmax15, alpha-entmax or ReLU), then output = A V. Fully masked rows give zero weights and
a zero output. Errors are RFC 9457 problem+json.

Try it in the [playground](/) (weights as bars and heatmaps); a typed Python client is the
`attention-client` package (clients/python in the repository).
"""

HOT_PATHS = frozenset(
    {
        "/v1/attention",
        "/v1/softmax",
        "/v2/models/{model_name}/infer",
        "/v2/models/{model_name}/versions/{model_version}/infer",
    }
)
"""Matched first: a tiny inference request should not be compared with every other route before its own."""

NO_NATIVE_TELEMETRY: dict[str, Any] = (
    {"telemetry": {"tracing": False, "metrics": False, "logs": False}}
    if "telemetry" in inspect.signature(FastAPI.__init__).parameters
    else {}
)
"""FastAPI's own OpenTelemetry (newer FastAPI versions) off: it looks for a configured provider on every
request (about 10 us), and with ``ATTN_TRACING`` the service's tracing middleware already makes the spans
(service/http/tracing.py); both would trace each request twice."""


def metrics_route(metrics: ServiceMetrics) -> APIRoute:
    async def metrics_endpoint(request: Request) -> Response:
        return Response(metrics.exposition(), media_type=CONTENT_TYPE)

    return RawRoute(
        "/metrics",
        metrics_endpoint,
        methods=["GET"],
        tags=["operations"],
        summary="Prometheus metrics (text format)",
        response_class=Response,
        responses={
            200: {
                "description": "Metrics in the Prometheus text format",
                "content": {"text/plain": {"schema": {"type": "string"}}},
            }
        },
    )


def route_table(plane: DataPlane, metrics: ServiceMetrics) -> list[APIRoute]:
    """Every API route, in the schema's order."""
    attention = v1_attention.routes(plane)
    logits = v1_logits.routes(plane)
    return [
        *operations.routes(plane.runtime),
        attention[0],  # /v1/attention
        logits[0],  # /v1/softmax
        *attention[1:],
        *v1_rollout.routes(plane),
        *logits[1:],
        *v1_sessions.routes(plane),
        *v2_routes.routes(plane),
        metrics_route(metrics),
    ]


Lifespan = Callable[[FastAPI], AbstractAsyncContextManager[Any]]
"""The app's lifespan; what it yields (a mapping or None) is the lifespan state that Starlette and the server share."""


def build_app(
    plane: DataPlane, metrics: ServiceMetrics, lifespan: Lifespan, tracer_provider: Any | None = None
) -> FastAPI:
    """The REST front end of ``plane``: routes, error answers, docs and playground, the edge, tracing."""
    settings: Settings = plane.settings
    app = FastAPI(
        title="Attention service",
        version=__version__,
        description=DESCRIPTION,
        lifespan=lifespan,
        docs_url=None,  # served by install_docs, with assets from a package instead of a CDN
        redoc_url=None,
        **NO_NATIVE_TELEMETRY,
    )
    app.state.plane = plane
    app.state.runtime = plane.runtime
    app.state.metrics = metrics
    install_error_handlers(app)
    table = route_table(plane, metrics)
    hot = [r for r in table if r.path in HOT_PATHS]
    app.router.routes[0:0] = hot + [r for r in table if r.path not in HOT_PATHS]
    if settings.gzip_level > 0:  # large answers compressed for clients that accept gzip
        app.add_middleware(GZipIfAccepted, minimum_size=settings.gzip_min_bytes, compresslevel=settings.gzip_level)
    install_openapi(
        app,
        list(table),
        [
            AttentionRequest,
            SoftmaxRequest,
            AttentionBackwardRequest,
            AnalyzeRequest,
            RolloutRequest,
            SampleRequest,
            CalibrateRequest,
            SessionStepRequest,
            *V2_MODELS,
        ],
    )
    install_docs(app)
    install_playground(app)
    install_edge(app, plane, metrics, settings)  # middleware and its error responses in the schema
    finish_openapi(app)  # last: examples, security schemes, no answer a route never sends
    install_tracing(app, settings.tracing, tracer_provider)  # outermost, only when ATTN_TRACING is on
    return app
