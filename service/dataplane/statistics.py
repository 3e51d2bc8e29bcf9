"""The statistics extension (Triton's; ``GET /v2/models[/{name}[/versions/{v}]]/stats``, gRPC
``ModelStatistics``): what the front ends measure of each inference request, and the answer both give.

What counts: the inference requests of the protocol's models, ``POST /v2/models/{name}[/versions/1]/infer`` and
gRPC ``ModelInfer``, from the moment a ready model takes the request (its body or message read) to its encoded
answer (``success``) or its error (``fail``: invalid input or parameters, over a limit, no compute slot in time,
a deadline passed, a cancel). /v1 requests are not counted: they have no model of the protocol (``/metrics``
counts them, by route and model). Refusals before a model takes the request (API key, caps, admission, a body
or message too large or too slow, an unknown model, not ready) are not counted either: ``/metrics`` has them
(``attn_http_requests_total``, ``attn_http_requests_rejected_total``).

Of a successful request (each counted once, so their counts are the ``success`` count):

- ``queue``: the wait for a compute slot (0 for work run on the event loop, which takes none);
- ``compute_input``: the decoding of its tensors and parameters (JSON or binary, protobuf contents) and their
  checks;
- ``compute_infer``: the engine's computation, and the diagnostics computed beside it;
- ``compute_output``: the encoding of the answer (the outputs, the response parameters, the body or message).

The numbers live in the service's metrics (:class:`StatisticsStore`, kept by
:class:`~service.observability.metrics.ServiceMetrics`), summed over the workers as ``/metrics`` sums them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Protocol, TypeVar

from service.dataplane.errors import not_found
from service.dataplane.models import MODEL_VERSION, MODELS, find_model
from service.dataplane.timing import Timing
from service.observability.statistics import ModelTotals

T = TypeVar("T")

DURATIONS = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output")
"""The statistics of ``inference_stats`` this service measures, in Triton's order."""
NO_CACHE = ("cache_hit", "cache_miss")
"""Triton's response cache statistics: always 0 (the service has no response cache)."""
PHASE_STATISTIC = {"decode": "compute_input", "encode": "compute_output"}
"""The statistic each of a model's timing phases (``timing_ms``) counts in; any other phase is ``compute_infer``."""


class StatisticsStore(Protocol):
    """Where the numbers are kept (the service's metrics implement it)."""

    def inference_ended(self, model: str, seconds: Mapping[str, float]) -> None: ...

    def inference_totals(self) -> Mapping[str, ModelTotals]: ...


class Clock:
    """What a front end measures of one inference request, from the moment its model takes it."""

    __slots__ = ("input_s", "output_s", "queue_s", "start", "timing")

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.queue_s = 0.0
        self.input_s = 0.0
        """The front end's own decoding (the wire form), before the model's phases."""
        self.output_s = 0.0
        """From the end of the model's last phase to the end of the front end's encoding."""
        self.timing: Timing | None = None

    def waited(self, seconds: float) -> None:
        """The request waited this long for a compute slot (the scheduler says so)."""
        self.queue_s += seconds

    def decode(self, fn: Callable[[], T]) -> T:
        """``fn()``, the front end's decoding of the request's wire form, timed as ``compute_input``."""
        t0 = time.perf_counter()
        try:
            return fn()
        finally:
            self.input_s += time.perf_counter() - t0

    def model_timing(self) -> Timing:
        """A new :class:`Timing` for the model's phases (``timing_ms``), read back when the request ends."""
        self.timing = Timing()
        return self.timing

    def encode(self, fn: Callable[[], T]) -> T:
        """``fn()``, the front end's encoding of the answer: ``compute_output`` runs from the end of the model's
        last phase (its response parameters are written after it) to the end of ``fn``.
        """
        t0 = self.timing.last if self.timing is not None else time.perf_counter()
        try:
            return fn()
        finally:
            self.output_s += time.perf_counter() - t0

    def seconds(self, ok: bool) -> dict[str, float]:
        """Seconds of each statistic the request counts in: ``success`` and the phases, or ``fail`` alone."""
        total = time.perf_counter() - self.start
        if not ok:
            return {"fail": total}
        out = {"success": total, "queue": self.queue_s, "compute_input": self.input_s, "compute_infer": 0.0}
        out["compute_output"] = self.output_s
        for name, t0, t1 in self.timing.phases if self.timing is not None else ():
            statistic = PHASE_STATISTIC.get(name, "compute_infer")
            out[statistic] += t1 - t0
        return out


class InferenceStatistics:
    """The statistics extension of one process's data plane: requests counted into ``store`` (nothing is kept
    without one), and the protocol's answer read from it.
    """

    def __init__(self, store: StatisticsStore | None) -> None:
        self.store = store

    @contextmanager
    def counted(self, model: str) -> Iterator[Clock]:
        """Count the request ``model`` takes now: a success when the block ends, a failure when it raises (a
        cancel included).
        """
        clock = Clock()
        try:
            yield clock
        except BaseException:
            if self.store is not None:
                self.store.inference_ended(model, clock.seconds(ok=False))
            raise
        if self.store is not None:
            self.store.inference_ended(model, clock.seconds(ok=True))

    def report(self, name: str = "", version: str = "") -> dict[str, Any]:
        """The protocol's answer, ``{"model_stats": [...]}``: of model ``name`` (empty: every model) at
        ``version`` (empty: every version, the one, "1"). ``NOT_FOUND`` for an unknown model or version.
        """
        if name:
            names = [find_model(name, version or None).name]
        elif version and version != MODEL_VERSION:
            raise not_found(f"the models have no version {version!r}; their versions are {MODEL_VERSION}")
        else:
            names = list(MODELS)
        totals = self.store.inference_totals() if self.store is not None else {}
        return {"model_stats": [model_statistics(n, totals.get(n) or ModelTotals()) for n in names]}


def duration(count: int, seconds: float) -> dict[str, int]:
    """A ``{count, ns}`` statistic."""
    return {"count": count, "ns": max(0, round(seconds * 1e9))}


def model_statistics(name: str, totals: ModelTotals) -> dict[str, Any]:
    """One model's entry of ``model_stats``, Triton's shape: every request is one inference and one execution
    (the models have no batch dimension and no dynamic batching), so ``batch_stats`` is empty.
    """
    success = totals.counts["success"]
    stats = {
        statistic: duration(totals.counts["fail"] if statistic == "fail" else success, totals.seconds[statistic])
        for statistic in DURATIONS
    }
    stats.update({statistic: duration(0, 0.0) for statistic in NO_CACHE})
    return {
        "name": name,
        "version": MODEL_VERSION,
        "last_inference": int(totals.last_success * 1e3),
        "inference_count": success,
        "execution_count": success,
        "inference_stats": stats,
        "batch_stats": [],
    }
