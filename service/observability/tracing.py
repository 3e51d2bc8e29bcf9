"""Optional OpenTelemetry tracing: off by default, on with ``ATTN_TRACING=true`` and the ``tracing`` extra.

``pip install 'attention-service[tracing]'`` brings the SDK, the ASGI instrumentation and the OTLP/HTTP
exporter. :func:`install_tracing` then adds ``OpenTelemetryMiddleware``
(opentelemetry-instrumentation-asgi) outside everything else: one server span per request, continuing
the caller's W3C ``traceparent`` (the default propagator, https://www.w3.org/TR/trace-context/), probes
and /metrics left out. Inside it the request's phases become child spans: ``engine`` around the engine
call (:class:`service.observability.metrics.TimedDispatcher`), and ``decode``, ``encode`` and
``diagnostics`` from the handler's timing marks (:func:`record_phases`). Spans leave in batches to the
OTLP endpoint that the standard ``OTEL_EXPORTER_OTLP_*`` variables name (``OTEL_SERVICE_NAME`` too).

With tracing off nothing here imports OpenTelemetry and :func:`span` / :func:`record_phases` cost one
context-variable read.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import AbstractContextManager, asynccontextmanager, nullcontext
from contextvars import ContextVar
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

_TRACER: ContextVar[Any | None] = ContextVar("attn_tracer", default=None)
"""The tracer of the app serving the current request (None: tracing off). Worker threads inherit it."""

# Not traced: probes and scrapes (a span per kubelet probe is noise). Regexes searched in the URL.
EXCLUDED_URLS = "/healthz,/readyz,/metrics,/v2/health/live,/v2/health/ready"
PHASES = {"decode": "decode", "encode": "encode", "diagnostics": "diagnostics"}
"""Timing marks of the handlers that become spans (the engine has a live span of its own)."""


_NO_SPAN: AbstractContextManager[None] = nullcontext()
"""What :func:`span` gives while tracing is off (stateless, so one instance serves every call)."""


def span(name: str, attributes: dict[str, Any] | None = None) -> AbstractContextManager[Any]:
    """A child span of the current one while tracing is on; nothing otherwise (a shared no-op context,
    not a generator: the engine call opens one per request).
    """
    tracer = _TRACER.get()
    if tracer is None:
        return _NO_SPAN
    cm: AbstractContextManager[Any] = tracer.start_as_current_span(name, attributes=attributes)
    return cm


def record_phases(marks: dict[str, float]) -> None:
    """Spans for the intervals between consecutive ``perf_counter`` marks (keys name the interval ending there).

    The handlers already take these marks for ``timing_ms``; turning them into spans afterwards keeps the
    request path unchanged. Only the names in :data:`PHASES` become spans.
    """
    tracer = _TRACER.get()
    if tracer is None or len(marks) < 2:
        return
    offset_ns = time.time_ns() - time.perf_counter_ns()  # perf_counter -> epoch, drift negligible here
    times = list(marks.values())
    for name, t0, t1 in zip(list(marks)[1:], times, times[1:], strict=False):
        if name in PHASES:
            phase = tracer.start_span(PHASES[name], start_time=offset_ns + int(t0 * 1e9))
            phase.end(end_time=offset_ns + int(t1 * 1e9))


class _TracerScope:
    """Makes the app's tracer current for the request (plain ASGI, one context-variable set per request)."""

    def __init__(self, app: ASGIApp, tracer: Any) -> None:
        self.app = app
        self.tracer = tracer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        token = _TRACER.set(self.tracer)
        try:
            await self.app(scope, receive, send)
        finally:
            _TRACER.reset(token)


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
