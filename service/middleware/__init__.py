"""Production hardening: limits, admission, authentication, security headers, metrics and logs.

:func:`install_hardening` wires everything into an app: one pure-ASGI layer
(:class:`~service.middleware.layer.ServiceMiddleware`: request id, access log,
metrics, security headers, API keys, body limits, admission by expected wait,
deadline, and the 499/500 answers), with Starlette's CORS inside it when
``ATTN_CORS_ALLOW_ORIGINS`` is set, and the admission's compute slots in
``app.state.admission`` for :func:`service.api.wire.run_cpu`. The limits of the
connection itself (header size and time, idle keep-alive, send timeout) are
the server's: see :mod:`service.middleware.protocol`.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response

from service.api.v2 import MODELS
from service.middleware.layer import Limits, ServiceMiddleware
from service.middleware.limits import Admission
from service.middleware.openapi import document_error_responses
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
    metrics = ServiceMetrics(models=MODELS)  # the model label: these names, else "other"
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

    admission = Admission(
        slots=settings.max_concurrent_requests,
        max_queue=settings.max_queued_requests,
        target_wait_s=min(settings.queue_target_s, settings.queue_timeout_s),
        queue_timeout_s=settings.queue_timeout_s,
        min_retry_after_s=settings.retry_after_s,
        on_change=metrics.set_admission,
    )
    app.state.admission = admission
    cors = None
    if settings.cors_allow_origins:
        cors = {
            "allow_origins": settings.cors_allow_origins,
            "allow_credentials": settings.cors_allow_credentials,
            "allow_methods": ["GET", "POST"],
            "allow_headers": CORS_HEADERS,
            "expose_headers": ["X-Request-ID", "Retry-After"],
        }
    app.add_middleware(
        ServiceMiddleware,
        metrics=metrics,
        admission=admission,
        limits=Limits(
            max_body_bytes=settings.max_body_bytes,
            request_timeout_s=settings.request_timeout_s,
            body_timeout_s=settings.body_timeout_s,
            min_upload_bytes_per_s=settings.min_upload_bytes_per_s,
            debug_delay_s=settings.debug_delay_s,
        ),
        api_keys=[key.get_secret_value() for key in settings.api_keys] if settings.api_keys else None,
        auth_exempt=settings.auth_exempt_paths,
        cors=cors,
    )

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
