"""Optional OpenTelemetry tracing: off by default, on with ``ATTN_TRACING=true`` and the ``tracing`` extra.

``pip install 'attention-service[tracing]'`` brings the SDK, the ASGI instrumentation and the OTLP/HTTP
exporter. :func:`install_tracing` then adds ``OpenTelemetryMiddleware``
(opentelemetry-instrumentation-asgi) outside everything else: one server span per request, continuing
the caller's W3C ``traceparent`` (the default propagator, https://www.w3.org/TR/trace-context/), probes
and /metrics left out. Inside it the request's phases become child spans: ``engine`` around the engine
call (:meth:`service.dataplane.context.Context.run_engine`), and ``decode``, ``encode`` and
``diagnostics`` from the request's timing marks (:mod:`service.observability.spans`). Spans leave in
batches to the OTLP endpoint that the standard ``OTEL_EXPORTER_OTLP_*`` variables name
(``OTEL_SERVICE_NAME`` too).

With tracing off nothing here imports OpenTelemetry.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from service.observability.spans import CURRENT_TRACER

# Not traced: probes and scrapes (a span per kubelet probe is noise). Regexes searched in the URL.
EXCLUDED_URLS = "/healthz,/readyz,/metrics,/v2/health/live,/v2/health/ready"


class _TracerScope:
    """Makes the app's tracer current for the request (plain ASGI, one context-variable set per request)."""

    def __init__(self, app: ASGIApp, tracer: Any) -> None:
        self.app = app
        self.tracer = tracer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        token = CURRENT_TRACER.set(self.tracer)
        try:
            await self.app(scope, receive, send)
        finally:
            CURRENT_TRACER.reset(token)


def otlp_tracer_provider() -> Any:
    """An SDK tracer provider that exports in batches over OTLP/HTTP (configured by OTEL_* variables)."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": "attention-service"}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    return provider


def install_tracing(app: Any, enabled: bool, provider: Any | None = None) -> Any | None:
    """With ``enabled``: the tracing middleware on ``app`` (outermost) and its provider flushed at shutdown.

    ``provider``: an OpenTelemetry ``TracerProvider`` (tests pass one with an in-memory exporter);
    default :func:`otlp_tracer_provider`. Returns the provider, or None when tracing is off.
    """
    if not enabled:
        return None
    try:
        from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware
    except ImportError as exc:
        raise RuntimeError(
            "ATTN_TRACING=true needs the tracing extra: pip install 'attention-service[tracing]'"
        ) from exc
    provider = provider if provider is not None else otlp_tracer_provider()
    app.add_middleware(_TracerScope, tracer=provider.get_tracer("service"))
    app.add_middleware(
        OpenTelemetryMiddleware,
        tracer_provider=provider,
        excluded_urls=EXCLUDED_URLS,
        exclude_spans=["receive", "send"],
    )
    inner = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(app_: Any) -> AsyncIterator[Any]:
        async with inner(app_) as state:
            yield state
        shutdown = getattr(provider, "shutdown", None)
        if callable(shutdown):
            shutdown()  # flush the spans still batched

    app.router.lifespan_context = lifespan
    return provider
