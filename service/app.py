"""The application factory: ``create_app(settings)`` builds the service from its parts.

One data plane per process (:class:`~service.dataplane.DataPlane`: engines, admission, memory budget,
scheduler), the metrics it reports to, and the front ends that call it: REST (:mod:`service.http`) and,
on its own port in the same event loop, gRPC (:mod:`service.grpc`, unless ``ATTN_GRPC_ENABLED=false``).
Nothing heavy happens at import time; the engines start in a worker thread after start-up, and
/readyz (and gRPC health) say not ready until they are.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import threading
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI

from service.dataplane import DataPlane
from service.dataplane.heap import freeze_startup_heap
from service.dataplane.models import MODELS
from service.dataplane.runtime import Runtime
from service.engines.base import Engine
from service.engines.cost import CostModel
from service.engines.numpy_engine import NumpyEngine
from service.http.app import build_app
from service.observability.metrics import ServiceMetrics, multiprocess_enabled
from service.settings import Settings

if TYPE_CHECKING:
    from service.grpc.server import GrpcServer

logger = logging.getLogger("service")


def default_engines(settings: Settings, cost_model: CostModel | None = None) -> dict[str, Engine]:
    """The numpy engine, plus the ONNX engine over ``settings.models_dir`` when enabled; both price their tasks
    with ``cost_model`` (default: the settings' calibration).
    """
    costs = cost_model if cost_model is not None else CostModel(settings.cost_factors())
    engines: dict[str, Engine] = {"numpy": NumpyEngine(threads=settings.numpy_threads, cost_model=costs)}
    if settings.enable_onnx:
        from service.engines.onnx_engine import OnnxEngine  # onnxruntime is imported only when used

        engines["onnx"] = OnnxEngine(
            settings.models_dir,
            providers=settings.onnx_providers,
            intra_op_threads=settings.onnx_intra_op_threads,
            graph_optimization_level=settings.onnx_graph_optimization_level,
            memory_arena=settings.onnx_memory_arena,
            cost_model=costs,
        )
    return engines


def create_app(
    settings: Settings | None = None,
    *,
    engines: Mapping[str, Engine] | None = None,
    tracer_provider: Any | None = None,
) -> FastAPI:
    """Build the service. ``engines`` replaces the default set (tests inject their own);
    ``tracer_provider`` the OTLP exporter of ``ATTN_TRACING`` (tests pass an in-memory one).

    Raises ``RuntimeError`` when metrics could not be shared between several workers.
    """
    settings = settings or Settings()
    if settings.workers > 1 and not multiprocess_enabled():
        raise RuntimeError(
            "ATTN_WORKERS > 1 but PROMETHEUS_MULTIPROC_DIR was not set before prometheus-client was imported: "
            "start the server with `python -m service serve` and ATTN_METRICS_DIR"
        )
    if settings.debug_delay_s:
        logger.warning("ATTN_DEBUG_DELAY_S=%s: every request is slowed down (test setting)", settings.debug_delay_s)
    # The factors measured by `serve` before it listened (ATTN_COST_CALIBRATION=auto), or given: this app's own.
    costs = CostModel(settings.cost_factors())
    metrics = ServiceMetrics(models=MODELS)  # the model label: these names, else "other"
    engines = dict(engines) if engines is not None else default_engines(settings, costs)
    plane = DataPlane(settings, engines, observer=metrics, costs=costs)
    runtime = plane.runtime

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[dict[str, Any]]:
        # With one worker, warm-up runs beside the server so that /healthz answers at once and /readyz says 503
        # until the engines are ready. With several, a worker takes connections only once its engines are warm
        # (uvicorn accepts after the lifespan's start-up): a replacement for a worker that died would otherwise
        # answer "engines are starting" while its siblings are ready to serve.
        loop = asyncio.get_running_loop()
        started: asyncio.Future[None] = loop.create_future()

        def done() -> None:
            if not started.done():
                started.set_result(None)

        def start() -> None:
            try:
                runtime.start_engines()
                # attn_engine_ready: which engines serve (degraded mode shows a 0)
                metrics.record_engines({name: bool(engine.ready) for name, engine in runtime.engines.items()})
                if settings.gc_freeze:
                    freeze_startup_heap()
            finally:
                with contextlib.suppress(RuntimeError):  # the loop closed first (a test app stopped early)
                    loop.call_soon_threadsafe(done)

        runtime.begin_serving()
        metrics.record_engines(dict.fromkeys(runtime.engines, False))
        threading.Thread(target=start, name="engine-startup", daemon=True).start()
        if settings.workers > 1:
            await started  # a failed start-up still lets the worker serve /readyz's reason
            logger.info("worker %d: engines started; taking connections", os.getpid())
        try:
            grpc_server = await start_grpc(plane, metrics) if settings.grpc_enabled else None
        except Exception:
            # The start failed (the gRPC port is taken): let the engines finish starting and close them first, as
            # a stop does. ONNX Runtime still building sessions as the process exits aborts it (SIGABRT, 134, not 3).
            await started
            runtime.close_engines()
            metrics.close()
            raise
        stopping = stop_on_signals(runtime, grpc_server, settings.shutdown_grace_s)
        try:
            # The server's connection protocol reads this (uvicorn hands the lifespan's state to it).
            yield {"attn.connection_refused": lambda: metrics.refused("connections")}
        finally:
            runtime.begin_stopping()
            if grpc_server is not None:
                await (stopping[0] if stopping else grpc_server.stop(settings.shutdown_grace_s))
            runtime.close_engines()
            plane.close()
            metrics.close()  # a stopping worker removes its live gauges (multiprocess mode)

    return build_app(plane, metrics, lifespan, tracer_provider)


async def start_grpc(plane: DataPlane, metrics: ServiceMetrics) -> GrpcServer:
    """The gRPC front end, serving (grpc is imported only when it is on)."""
    from service.grpc.server import GrpcServer

    server = GrpcServer(plane, metrics)
    await server.start()
    return server


def stop_on_signals(runtime: Runtime, server: GrpcServer | None, grace_s: float) -> list[asyncio.Task[None]]:
    """On SIGTERM or SIGINT: readiness says not ready at once, for both protocols (one flag, set in the handler
    itself), and gRPC's graceful stop begins while uvicorn drains REST. Each signal then goes to the handler
    uvicorn installed (which restores the originals when it exits). Returns a list that holds gRPC's stopping
    task once it runs.
    """
    stopping: list[asyncio.Task[None]] = []
    if threading.current_thread() is not threading.main_thread():
        return stopping  # signals reach the main thread only (an in-process test client runs elsewhere)
    loop = asyncio.get_running_loop()

    def begin() -> None:
        if server is not None and not stopping:
            stopping.append(loop.create_task(server.stop(grace_s), name="grpc-stop"))

    for sig in (signal.SIGTERM, signal.SIGINT):
        previous = signal.getsignal(sig)

        def handler(signum: int, frame: Any, previous: Any = previous) -> None:
            runtime.begin_stopping()
            if callable(previous):
                previous(signum, frame)
            loop.call_soon_threadsafe(begin)

        signal.signal(sig, handler)
    return stopping
