"""The numbers of the statistics extension (Triton's ``GET /v2/models/stats``, gRPC ``ModelStatistics``), kept as
Prometheus metrics and read back from them: of this process, or of every worker in multiprocess mode.

Three families (:class:`~service.observability.metrics.ServiceMetrics` registers them beside the others, so
``/metrics`` shows them too):

- ``attn_inference_request_duration_seconds`` (summary; ``model``, ``outcome`` = ``success`` or ``fail``): the
  inference requests of each model, counted, and their time from the model taking the request to its answer;
- ``attn_inference_phase_seconds_total`` (counter; ``model``, ``phase`` = ``queue``, ``compute_input``,
  ``compute_infer``, ``compute_output``): the time the successful requests spent in each phase (each phase is
  counted once per successful request, so its count is the ``success`` count);
- ``attn_inference_last_success_timestamp_seconds`` (gauge, the largest of the workers'): when the model's last
  successful request ended (Unix time).

With ``PROMETHEUS_MULTIPROC_DIR`` set, every worker writes its values to its own files and :func:`read_totals`
merges the files of all workers, those that have died since the start included (as ``/metrics`` does): the
totals are the server's, whichever worker answers the question.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import multiprocess

REQUESTS = "attn_inference_request_duration_seconds"
PHASES = "attn_inference_phase_seconds"
LAST_SUCCESS = "attn_inference_last_success_timestamp_seconds"
OUTCOMES = ("success", "fail")
PHASE_NAMES = ("queue", "compute_input", "compute_infer", "compute_output")


@dataclass
class ModelTotals:
    """One model's totals since the server started: a count and seconds per outcome (``success``, ``fail``),
    seconds per phase, and the Unix time its last successful request ended (0.0: none yet).
    """

    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0))
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(OUTCOMES + PHASE_NAMES, 0.0))
    last_success: float = 0.0


def totals_from(families: Iterable[Any]) -> dict[str, ModelTotals]:
    """The totals by model, from collected metric families (``prometheus_client.Metric``: any others are
    skipped). A family seen twice (several workers' files not merged) is added up.
    """
    totals: dict[str, ModelTotals] = {}
    for family in families:
        if family.name not in (REQUESTS, PHASES, LAST_SUCCESS):
            continue
        for sample in family.samples:
            labels = sample.labels
            model = labels.get("model", "")
            kept = totals.get(model)
            if kept is None:
                kept = totals[model] = ModelTotals()
            if sample.name == REQUESTS + "_count" and labels.get("outcome") in OUTCOMES:
                kept.counts[labels["outcome"]] += round(sample.value)
            elif sample.name == REQUESTS + "_sum" and labels.get("outcome") in OUTCOMES:
                kept.seconds[labels["outcome"]] += sample.value
            elif sample.name == PHASES + "_total" and labels.get("phase") in PHASE_NAMES:
                kept.seconds[labels["phase"]] += sample.value
            elif sample.name == LAST_SUCCESS:
                kept.last_success = max(kept.last_success, sample.value)
    return totals


def read_totals(collectors: Iterable[Any], multiprocess_mode: bool) -> dict[str, ModelTotals]:
    """The totals by model: of every worker (their files, merged as ``/metrics`` merges them) in multiprocess
    mode, else of ``collectors`` (this process's metric objects).
    """
    if multiprocess_mode:
        return totals_from(multiprocess.MultiProcessCollector(None).collect())
    return totals_from(family for collector in collectors for family in collector.collect())
