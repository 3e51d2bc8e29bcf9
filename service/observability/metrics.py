"""Prometheus metrics of the service (prometheus-client), safe with several worker processes.

One :class:`ServiceMetrics` per app, with its own registry (tests build many
apps in one process). With ``PROMETHEUS_MULTIPROC_DIR`` set before
prometheus-client is imported (``python -m service serve`` does it when
``ATTN_METRICS_DIR`` is set), every worker writes its values to files there and
``GET /metrics`` merges the files of all workers (``MultiProcessCollector``);
process and GC collectors are left out in that mode since they would describe
one random worker.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Summary,
    disable_created_metrics,
    gc_collector,
    generate_latest,
    multiprocess,
    platform_collector,
    process_collector,
)
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from service.dataplane.sessions.store import EVICTION_REASONS
from service.observability.multiproc import check_metrics_room
from service.observability.statistics import LAST_SUCCESS, PHASE_NAMES, PHASES, REQUESTS, ModelTotals, read_totals

logger = logging.getLogger("service.metrics")

disable_created_metrics()  # no ``*_created`` series: they double the output and nothing here reads them

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4
"""The classic text format: what ``generate_latest`` writes and every Prometheus scrapes."""

SIZE_BUCKETS = tuple(float(4**k) for k in range(3, 15))
"""Body sizes in bytes: 64 B to 256 MiB, by factors of 4."""
V1_MODELS = {
    "/v1/attention": "attention",
    "/v1/softmax": "softmax",
    "/v1/attention/backward": "attention_backward",
    "/v1/attention/analyze": "analyze",
    "/v1/attention/rollout": "attention_rollout",
    "/v1/sample": "sample",
    "/v1/calibrate": "calibrate",
}
"""The model each /v1 route serves (the /v2 routes name theirs in the path)."""
V2_MODEL_ROUTE = "/v2/models/{model_name}"
OTHER_MODEL = "other"
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
REJECT_REASONS = (
    "unauthorized",
    "body_too_large",
    "body_timeout",
    "queue_full",
    "queue_wait",
    "queue_timeout",
    "deadline",
    "body_memory",
    "body_fields",
    "connections",
    "shutdown",
    "stopping",
    "grpc_calls",
    "message_timeout",
)
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def multiprocess_enabled() -> bool:
    """Whether prometheus-client writes values to files (decided when it was imported)."""
    return bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))


def model_label(route: str, path: str, models: frozenset[str]) -> str:
    """The model a request addressed, as a bounded label: ``attention``, ``softmax``, ... for the routes that
    serve one (``other`` for a /v2 model name the server does not have), empty for every other route.
    """
    model = V1_MODELS.get(route)
    if model is not None:
        return model
    if route.startswith(V2_MODEL_ROUTE):
        parts = path.split("/", 4)  # "", "v2", "models", name, ...
        return parts[3] if len(parts) > 3 and parts[3] in models else OTHER_MODEL
    return ""


class ServiceMetrics:
    """The metrics one service process records.

    ``models``: the model names the server has (the /v2 registry); a request naming another counts as
    ``other``, so the ``model`` label stays bounded whatever clients send.
    """

    def __init__(self, models: Collection[str] = ()) -> None:
        self.models = frozenset(models) | frozenset(V1_MODELS.values())
        self.multiprocess = multiprocess_enabled()
        if self.multiprocess:
            # Room for this worker's files, or no start (a full directory would kill it with SIGBUS later).
            check_metrics_room(Path(os.environ["PROMETHEUS_MULTIPROC_DIR"]), 1, spare=0)
            drop_dead_workers()  # a worker replacing one that died: drop the dead one's live gauges
        r = self.registry = CollectorRegistry()
        if not self.multiprocess:
            process_collector.ProcessCollector(registry=r)
            platform_collector.PlatformCollector(registry=r)
            gc_collector.GCCollector(registry=r)
        self.requests = Counter(
            "attn_http_requests",
            "Requests answered, by protocol (http or grpc), method, route template (gRPC: the method's path), model "
            "and status (HTTP: the code; gRPC: the status name).",
            ["protocol", "method", "route", "model", "status"],
            registry=r,
        )
        self.latency = Histogram(
            "attn_http_request_duration_seconds",
            "Time from the request's arrival to the end of its response, by protocol.",
            ["protocol", "method", "route", "model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.request_size = Histogram(
            "attn_http_request_size_bytes",
            "Request body bytes read from the wire (before gzip inflation; gRPC: the message), by route and model.",
            ["protocol", "route", "model"],
            buckets=SIZE_BUCKETS,
            registry=r,
        )
        self.response_size = Histogram(
            "attn_http_response_size_bytes",
            "Response body bytes sent (after compression; gRPC: the message), by route and model.",
            ["protocol", "route", "model"],
            buckets=SIZE_BUCKETS,
            registry=r,
        )
        self.in_flight = Gauge(
            "attn_http_requests_in_flight",
            "Requests holding a processing slot (abandoned work past its deadline included).",
            multiprocess_mode="livesum",
            registry=r,
        )
        self.queued = Gauge(
            "attn_http_requests_queued",
            "Requests waiting for a processing slot.",
            multiprocess_mode="livesum",
            registry=r,
        )
        self.queue_wait = Histogram(
            "attn_http_queue_wait_seconds",
            "Time admitted requests waited for a processing slot.",
            buckets=(0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
            registry=r,
        )
        self.rejected = Counter(
            "attn_http_requests_rejected",
            "Requests refused before or instead of being processed, by reason.",
            ["reason"],
            registry=r,
        )
        self.engine_compute = Histogram(
            "attn_engine_compute_seconds",
            "Time engines spent computing, by engine, provider, model and normalizer.",
            ["engine", "provider", "model", "normalizer"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.engine_ready = Gauge(
            "attn_engine_ready",
            "1 when the engine started and serves requests; 0 while it starts or after its start-up failed "
            "(degraded mode when it is not required: /readyz says why).",
            ["engine"],
            multiprocess_mode="livemin",  # 0 when any live worker lacks the engine
            registry=r,
        )
        # The statistics extension's numbers (service.observability.statistics), by model: /v2 and gRPC inference.
        self.inference_requests = Summary(
            REQUESTS,
            "Inference requests (/v2 and gRPC) by model and outcome (success or fail), and their time from the model "
            "taking the request (body or message read) to its encoded answer or its error.",
            ["model", "outcome"],
            registry=r,
        )
        self.inference_phases = Counter(
            PHASES,
            "Time the successful inference requests spent waiting for a compute slot (queue), decoding their tensors "
            "(compute_input), computing (compute_infer) and encoding their answer (compute_output), by model.",
            ["model", "phase"],
            registry=r,
        )
        self.inference_last_success = Gauge(
            LAST_SUCCESS,
            "When the model's last successful inference request ended (Unix time; the latest of all workers').",
            ["model"],
            multiprocess_mode="max",
            registry=r,
        )
        # Attention sessions (service.dataplane.sessions): no label names a sequence.
        self.sessions_live = Gauge(
            "attn_sessions_live", "Attention sessions live.", multiprocess_mode="livesum", registry=r
        )
        self.session_cache_bytes = Gauge(
            "attn_session_cache_bytes",
            "Bytes the sessions' key/value caches hold (their buffers, grown ahead of their positions).",
            multiprocess_mode="livesum",
            registry=r,
        )
        self.session_positions = Gauge(
            "attn_session_cache_positions",
            "Key positions the sessions' caches keep, all sessions together.",
            multiprocess_mode="livesum",
            registry=r,
        )
        self.session_evictions = Counter(
            "attn_session_evictions",
            "Sessions that went without an end: idle (ATTN_SESSION_IDLE_S), pressure (evicted, least recently "
            "used, for another cache's room), restarted (a start on a live id), stream_closed (the gRPC stream that "
            "carried it closed, ATTN_SESSION_END_WITH_STREAM).",
            ["reason"],
            registry=r,
        )
        self.session_steps = Counter("attn_session_steps", "Session steps answered.", registry=r)
        for reason in EVICTION_REASONS:
            self.session_evictions.labels(reason)
        self._request_children: dict[tuple[str, str, str, str, int | str], tuple[Any, Any, Any, Any]] = {}
        self._compute: dict[tuple[str, str, str, str], Any] = {}
        self._inference: dict[str, tuple[Any, Any, tuple[Any, ...], Any]] = {}
        self._last_success_ms: dict[str, int] = {}
        for reason in REJECT_REASONS:
            self.rejected.labels(reason)  # exported at 0, so rate() works from the first scrape

    def observe_request(
        self,
        method: str,
        route: str,
        status: int | str,
        seconds: float,
        *,
        path: str = "",
        protocol: str = "http",
        model: str | None = None,
        request_bytes: int | None = None,
        response_bytes: int | None = None,
    ) -> None:
        """One answered request: count, duration and, when given, body sizes, labelled by protocol, route and
        model (``model``: the model a gRPC call named, else found from the HTTP route and path).
        """
        method = method if method in METHODS else "OTHER"
        if model is None:
            model = model_label(route, path, self.models)
        elif model and model not in self.models:
            model = OTHER_MODEL
        key = (protocol, method, route, model, status)
        children = self._request_children.get(key)
        if children is None:  # labels() takes a lock and checks the environment: once per series, not per request
            children = self._request_children[key] = (
                self.requests.labels(protocol, method, route, model, str(status)),
                self.latency.labels(protocol, method, route, model),
                self.request_size.labels(protocol, route, model),
                self.response_size.labels(protocol, route, model),
            )
        children[0].inc()
        children[1].observe(seconds)
        if request_bytes is not None:
            children[2].observe(request_bytes)
        if response_bytes is not None:
            children[3].observe(response_bytes)

    def record_engines(self, ready: dict[str, bool]) -> None:
        """Each engine's state (``attn_engine_ready``): at start-up, then once start-up is over."""
        for name, ok in ready.items():
            self.engine_ready.labels(name).set(1 if ok else 0)

    def sessions_changed(self, live: int, cache_bytes: int, positions: int) -> None:
        """The sessions' totals, after a start or an end, and from the sweeper (twice a second at most)."""
        self.sessions_live.set(live)
        self.session_cache_bytes.set(cache_bytes)
        self.session_positions.set(positions)

    def session_evicted(self, reason: str) -> None:
        self.session_evictions.labels(reason).inc()

    def session_stepped(self) -> None:
        self.session_steps.inc()

    def admission_changed(self, computing: int, queued: int) -> None:
        """The compute slots' state, after each change."""
        self.in_flight.set(computing)
        self.queued.set(queued)

    def refused(self, reason: str) -> None:
        """A request refused before or instead of being processed (one of :data:`REJECT_REASONS`)."""
        self.rejected.labels(reason).inc()

    def queue_waited(self, seconds: float) -> None:
        """An admitted request waited this long for a compute slot."""
        self.queue_wait.observe(seconds)

    def engine_ran(self, engine: str, provider: str, model: str, normalizer: str, seconds: float) -> None:
        """An engine computed one request (``normalizer`` is one of the service's, or ``other``)."""
        key = (engine, provider, model, normalizer)
        histogram = self._compute.get(key)
        if histogram is None:  # labels() takes a lock and validates its arguments: once per series, not per run
            histogram = self._compute[key] = self.engine_compute.labels(*key)
        histogram.observe(seconds)

    def inference_ended(self, model: str, seconds: Mapping[str, float]) -> None:
        """One inference request of ``model`` ended: ``seconds`` has ``success`` and each phase's time (an
        answered request) or ``fail`` alone (statistics extension).
        """
        children = self._inference.get(model)
        if children is None:  # labels() takes a lock and validates its arguments: once per model
            children = self._inference[model] = (
                self.inference_requests.labels(model, "success"),
                self.inference_requests.labels(model, "fail"),
                tuple(self.inference_phases.labels(model, phase) for phase in PHASE_NAMES),
                self.inference_last_success.labels(model),
            )
        failed = seconds.get("fail")
        if failed is not None:
            children[1].observe(failed)
            return
        children[0].observe(seconds["success"])
        for phase, child in zip(PHASE_NAMES, children[2], strict=True):
            spent = seconds.get(phase, 0.0)
            if spent > 0.0:  # a write less (in multiprocess mode, to the worker's file) for no queue wait
                child.inc(spent)
        now = time.time()
        ms = int(now * 1e3)
        if ms != self._last_success_ms.get(model):  # the statistics say milliseconds: one write per millisecond
            self._last_success_ms[model] = ms
            children[3].set(now)

    def inference_totals(self) -> dict[str, ModelTotals]:
        """The statistics extension's totals by model, of every worker in multiprocess mode."""
        collectors = (self.inference_requests, self.inference_phases, self.inference_last_success)
        return read_totals(collectors, self.multiprocess)

    def exposition(self) -> bytes:
        """The text format of every metric (of all workers in multiprocess mode)."""
        if self.multiprocess:
            drop_dead_workers()  # a worker killed since the last scrape: its live gauges go now
            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)
            return generate_latest(registry)
        return generate_latest(self.registry)

    def close(self) -> None:
        """At worker exit: drop this process's live gauges from the shared directory."""
        if self.multiprocess:
            multiprocess.mark_process_dead(os.getpid())


def _running(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, dead but not yet reaped by its parent, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, under another user
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rpartition(b")")[2].split()[0] != b"Z"
    except (OSError, IndexError):  # no /proc (not Linux), or it just went
        return True


def drop_dead_workers(directory: str | None = None) -> list[int]:
    """``mark_process_dead`` for every worker with live-gauge files that no longer runs; returns their pids.

    prometheus-client merges each worker's file into the scrape, and a ``livesum`` gauge such as
    ``attn_http_requests_in_flight`` keeps the count of a worker that died without cleaning up
    (SIGKILL, out of memory) forever. uvicorn's supervisor replaces such a worker without any hook
    for the app, so each worker drops the dead ones' files at its start (the replacement does it
    as it comes up) and at every scrape.
    """
    path = directory or os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if not path:
        return []
    dead: set[int] = set()
    for name in os.listdir(path):
        if not (name.startswith("gauge_live") and name.endswith(".db")):
            continue
        pid_text = name[: -len(".db")].rpartition("_")[2]
        if pid_text.isdigit() and int(pid_text) != os.getpid() and not _running(int(pid_text)):
            dead.add(int(pid_text))
    for pid in sorted(dead):
        multiprocess.mark_process_dead(pid, path)
        logger.warning("dropped the live gauges of worker process %d, which is no longer running", pid)
    return sorted(dead)
