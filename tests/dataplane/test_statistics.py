"""The statistics extension's bookkeeping (service/dataplane/statistics.py) on the service's metrics, in process:
what a request counts in, how a model's timing phases map to Triton's statistics, and the answer's shape.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from service.dataplane.errors import Kind, ServiceError
from service.dataplane.models import MODELS
from service.dataplane.statistics import InferenceStatistics
from service.observability.metrics import ServiceMetrics


def test_a_success_counts_each_phase_once_and_a_failure_only_itself() -> None:
    stats = InferenceStatistics(ServiceMetrics(models=MODELS))
    with stats.counted("softmax") as clock:
        clock.decode(lambda: time.sleep(0.002))
        timing = clock.model_timing()
        time.sleep(0.002)
        timing.phase("decode")
        time.sleep(0.003)
        timing.phase("compute")
        time.sleep(0.001)
        timing.phase("diagnostics")
        clock.waited(0.25)  # what the scheduler reports
        clock.encode(lambda: time.sleep(0.002))
    for error in (ServiceError(Kind.INVALID, "no"), asyncio.CancelledError()):
        with pytest.raises(type(error)), stats.counted("softmax"):
            raise error
    entry = stats.report("softmax")["model_stats"][0]
    inference = entry["inference_stats"]
    assert entry["inference_count"] == entry["execution_count"] == 1 and entry["last_inference"] > 0
    assert {k: v["count"] for k, v in inference.items()} == {
        "success": 1,
        "fail": 2,
        "queue": 1,
        "compute_input": 1,
        "compute_infer": 1,
        "compute_output": 1,
        "cache_hit": 0,
        "cache_miss": 0,
    }
    ns = {k: v["ns"] for k, v in inference.items()}
    assert ns["queue"] == 250_000_000  # as reported, though the test never waited
    assert 3.9e6 <= ns["compute_input"] < 50e6  # the front end's decoding and the model's "decode" phase
    assert 3.9e6 <= ns["compute_infer"] < 50e6  # "compute" and "diagnostics"
    assert 1.9e6 <= ns["compute_output"] < 50e6
    assert ns["success"] >= ns["compute_input"] + ns["compute_infer"] + ns["compute_output"]


def test_every_model_or_one_and_not_found_for_the_rest() -> None:
    stats = InferenceStatistics(ServiceMetrics(models=MODELS))
    assert [m["name"] for m in stats.report()["model_stats"]] == list(MODELS)
    assert [m["name"] for m in stats.report("", "1")["model_stats"]] == list(MODELS)
    assert stats.report("sample", "1") == stats.report("sample")
    for name, version, words in (
        ("bert", "", "unknown model 'bert'"),
        ("sample", "2", "model 'sample' has no version '2'"),
        ("", "2", "the models have no version '2'"),
    ):
        with pytest.raises(ServiceError, match=words) as err:
            stats.report(name, version)
        assert err.value.kind is Kind.NOT_FOUND


def test_without_a_store_nothing_is_counted() -> None:
    stats = InferenceStatistics(None)
    with stats.counted("attention"):
        pass
    assert stats.report("attention")["model_stats"][0]["inference_count"] == 0


def test_the_numbers_are_on_metrics_too() -> None:
    metrics = ServiceMetrics(models=MODELS)
    metrics.inference_ended("attention", {"success": 0.5, "queue": 0.1, "compute_infer": 0.3})
    text = metrics.exposition().decode()
    assert 'attn_inference_request_duration_seconds_count{model="attention",outcome="success"} 1.0' in text
    assert 'attn_inference_phase_seconds_total{model="attention",phase="compute_infer"} 0.3' in text
    assert 'attn_inference_last_success_timestamp_seconds{model="attention"}' in text
