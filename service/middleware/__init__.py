"""Production hardening: limits, backpressure, authentication, security headers, metrics and logs.

:func:`install_hardening` wires everything into an app. The middleware, from
the outside in (the first sees the request first and the response last):

1. ``SecurityHeadersMiddleware``: outermost, so every answer, the 500s and
   the middleware's own refusals included, carries the security headers.
2. ``RequestContextMiddleware``: request id, access log, request metrics and
   the 500 answer; outside every refusal so each one is logged and counted.
3. ``CorsMiddleware`` (only with ``ATTN_CORS_ALLOW_ORIGINS``): preflights are
   answered before authentication and admission (browsers send them without
   credentials), and 401/413/503 answers still carry the CORS headers a
   browser needs to read them.
4. ``ApiKeyMiddleware`` (only with ``ATTN_API_KEYS``): strangers are refused
   before they cost a slot or a body read.
5. ``BodySizeLimitMiddleware``: an oversized ``Content-Length`` is refused
   before queueing; streamed bodies are counted as the route reads them.
6. ``DeadlineMiddleware``: the time limit covers the queue wait and the work.
7. ``AdmissionMiddleware``: innermost, so a slot is held exactly while the app
   works, including work past its deadline (see ``DeadlineMiddleware``).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response

from service.middleware.base import OPERATIONAL_PATHS
from service.middleware.context import RequestContextMiddleware
from service.middleware.limits import AdmissionGate, AdmissionMiddleware, BodySizeLimitMiddleware, DeadlineMiddleware
from service.middleware.openapi import document_error_responses
from service.middleware.security import ApiKeyMiddleware, CorsMiddleware, SecurityHeadersMiddleware
from service.observability.metrics import CONTENT_TYPE, ServiceMetrics, TimedDispatcher, multiprocess_enabled
from service.settings import Settings

logger = logging.getLogger("service")

CORS_HEADERS = ["Authorization", "Content-Type", "Content-Encoding", "Accept-Encoding", "X-API-Key", "X-Request-ID"]


def install_hardening(app: FastAPI, settings: Settings) -> ServiceMetrics:
    """Add the middleware, ``GET /metrics``, engine timing and the error responses to the schema.

    Call after the routers are included. Raises ``RuntimeError`` when metrics
    could not be shared between several workers.
    """
    if settings.workers > 1 and not multiprocess_enabled():
        raise RuntimeError(
            "ATTN_WORKERS > 1 but PROMETHEUS_MULTIPROC_DIR was not set before prometheus-client was imported: "
            "start the server with `python -m service serve` and ATTN_METRICS_DIR"
        )
    if settings.debug_delay_s:
        logger.warning("ATTN_DEBUG_DELAY_S=%s: every request is slowed down (test setting)", settings.debug_delay_s)
    metrics = ServiceMetrics()
    runtime = app.state.runtime
    runtime.dispatcher = TimedDispatcher(runtime.dispatcher, metrics)
    app.state.metrics = metrics

    async def metrics_endpoint(request: Request) -> Response:
        return Response(metrics.exposition(), media_type=CONTENT_TYPE)

    app.add_api_route(
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

    # add_middleware puts each new middleware outside the ones before it: innermost first.
    gate = AdmissionGate(
        settings.max_concurrent_requests,
        settings.max_queued_requests,
        settings.queue_timeout_s,
        on_change=metrics.set_admission,
    )
    app.add_middleware(
        AdmissionMiddleware,
        gate=gate,
        exempt=OPERATIONAL_PATHS,
        retry_after_s=settings.retry_after_s,
        metrics=metrics,
        debug_delay_s=settings.debug_delay_s,
    )
    app.add_middleware(DeadlineMiddleware, timeout_s=settings.request_timeout_s, metrics=metrics)
    app.add_middleware(BodySizeLimitMiddleware, max_bytes=settings.max_body_bytes, metrics=metrics)
    if settings.api_keys:
        keys = [key.get_secret_value() for key in settings.api_keys]
        app.add_middleware(ApiKeyMiddleware, keys=keys, exempt=settings.auth_exempt_paths, metrics=metrics)
    if settings.cors_allow_origins:
        app.add_middleware(
            CorsMiddleware,
            allow_origins=settings.cors_allow_origins,
            allow_credentials=settings.cors_allow_credentials,
            allow_methods=["GET", "POST"],
            allow_headers=CORS_HEADERS,
            expose_headers=["X-Request-ID", "Retry-After"],
        )
    app.add_middleware(RequestContextMiddleware, metrics=metrics)
    app.add_middleware(SecurityHeadersMiddleware)

    _close_metrics_at_shutdown(app, metrics)
    document_error_responses(app, settings)
    return metrics


def _close_metrics_at_shutdown(app: FastAPI, metrics: ServiceMetrics) -> None:
    """Wrap the app's lifespan so that a stopping worker removes its live gauges (multiprocess mode)."""
    inner = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(app_: Any) -> AsyncIterator[Any]:
        async with inner(app_) as state:
            yield state
        metrics.close()

    app.router.lifespan_context = lifespan
