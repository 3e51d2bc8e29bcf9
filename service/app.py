"""The application factory: ``create_app(settings)`` builds the app from its parts.

Nothing heavy happens at import time; ONNX Runtime sessions are created and
warmed up in a worker thread after start-up, and /readyz answers 503 until
they are ready.
"""

from __future__ import annotations

import inspect
import logging
import threading
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI

from service import __version__
from service.api import gradients, logits, operations, v1, v2, v2_logits
from service.api.docs import finish_openapi, install_docs, install_openapi, operation_id
from service.api.errors import install_error_handlers
from service.api.fast_routes import install_fast_routes
from service.api.gradient_schemas import AnalyzeRequest, AttentionBackwardRequest
from service.api.logits_schemas import CalibrateRequest, SampleRequest
from service.api.memory import MemoryBudget
from service.api.schemas import AttentionRequest, SoftmaxRequest
from service.api.v2_schemas import V2_MODELS
from service.api.wire import GZipIfAccepted
from service.engines.base import Engine
from service.engines.dispatch import EngineDispatcher
from service.engines.numpy_engine import NumpyEngine
from service.middleware import install_hardening
from service.observability.tracing import install_tracing
from service.playground import install_playground
from service.runtime import Runtime, freeze_startup_heap
from service.settings import Settings

logger = logging.getLogger("service")

DESCRIPTION = """\
Attention computed, inspected and served over HTTP.

Numerical contract: scores = scale * Q K^T, plus the mask bias (boolean masks select,
float masks add), divided by the temperature, normalized over the keys (softmax, sparsemax,
entmax15, alpha-entmax or ReLU), then output = A V. Fully masked rows give zero weights and
a zero output. Errors are RFC 9457 problem+json.

Try it in the [playground](/) (weights as bars and heatmaps); a typed Python client is the
`attention-client` package (clients/python in the repository).
"""


def default_engines(settings: Settings) -> dict[str, Engine]:
    """The numpy engine, plus the ONNX engine over ``settings.models_dir`` when enabled."""
    engines: dict[str, Engine] = {"numpy": NumpyEngine(threads=settings.numpy_threads)}
    if settings.enable_onnx:
        from service.engines.onnx_engine import OnnxEngine  # onnxruntime is imported only when used

        engines["onnx"] = OnnxEngine(
            settings.models_dir,
            providers=settings.onnx_providers,
            intra_op_threads=settings.onnx_intra_op_threads,
            graph_optimization_level=settings.onnx_graph_optimization_level,
            memory_arena=settings.onnx_memory_arena,
        )
    return engines


NO_NATIVE_TELEMETRY: dict[str, Any] = (
    {"telemetry": {"tracing": False, "metrics": False, "logs": False}}
    if "telemetry" in inspect.signature(FastAPI.__init__).parameters
    else {}
)
"""FastAPI's own OpenTelemetry (newer FastAPI versions) off: it looks for a configured provider on every
request (about 10 us), and with ``ATTN_TRACING`` the service's tracing middleware already makes the spans
(service/observability/tracing.py); both would trace each request twice."""


def create_app(
    settings: Settings | None = None,
    *,
    engines: Mapping[str, Engine] | None = None,
    tracer_provider: Any | None = None,
) -> FastAPI:
    """Build the service. ``engines`` replaces the default set (tests inject their own);
    ``tracer_provider`` the OTLP exporter of ``ATTN_TRACING`` (tests pass an in-memory one).
    """
    settings = settings or Settings()
    engine_map = dict(engines) if engines is not None else default_engines(settings)
    runtime = Runtime(
        settings=settings,
        engines=engine_map,
        dispatcher=EngineDispatcher(
            engine_map,
            small_task_scores=settings.auto_numpy_max_scores,
            large_task_scores=settings.auto_numpy_large_scores,
        ),
        memory=MemoryBudget(settings.memory_budget_bytes, settings.queue_timeout_s, settings.retry_after_s),
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # Warm-up runs beside the server so that /healthz answers at once and
        # /readyz says 503 until the engines are ready.
        record = getattr(getattr(app.state, "metrics", None), "record_engines", None)

        def start() -> None:
            runtime.start_engines()
            if callable(record):  # attn_engine_ready: which engines serve (degraded mode shows a 0)
                record({name: bool(engine.ready) for name, engine in runtime.engines.items()})
            if settings.gc_freeze:
                freeze_startup_heap()

        if callable(record):
            record(dict.fromkeys(runtime.engines, False))
        threading.Thread(target=start, name="engine-startup", daemon=True).start()
        yield
        runtime.close_engines()

    app = FastAPI(
        title="Attention service",
        version=__version__,
        description=DESCRIPTION,
        lifespan=lifespan,
        docs_url=None,  # served by install_docs, with assets from a package instead of a CDN
        redoc_url=None,
        generate_unique_id_function=operation_id,
        **NO_NATIVE_TELEMETRY,
    )
    app.state.runtime = runtime
    install_error_handlers(app)
    app.include_router(operations.router)
    app.include_router(v1.router)
    app.include_router(gradients.router)
    app.include_router(logits.router)
    v2.MODELS.update(v2_logits.MODELS)
    app.include_router(v2.router)
    install_fast_routes(app)  # the same endpoints as plain Starlette routes, matched first
    if settings.gzip_level > 0:  # large answers compressed for clients that accept gzip
        app.add_middleware(GZipIfAccepted, minimum_size=settings.gzip_min_bytes, compresslevel=settings.gzip_level)
    install_openapi(
        app,
        [
            AttentionRequest,
            SoftmaxRequest,
            AttentionBackwardRequest,
            AnalyzeRequest,
            SampleRequest,
            CalibrateRequest,
            *V2_MODELS,
        ],
    )
    install_docs(app)
    install_playground(app)
    install_hardening(app, settings)  # middleware, /metrics and the error responses in the schema
    finish_openapi(app)  # last: examples, security schemes, no answer a route never sends
    install_tracing(app, settings.tracing, tracer_provider)  # outermost, only when ATTN_TRACING is on
    return app
