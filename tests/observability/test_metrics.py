"""Engine metrics by model and normalizer, with bounded label values (service/observability/metrics.py)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.core.backward import BackwardTask
from service.core.types import NORMALIZERS, AttentionInputs, AttentionParams, AttentionTask
from service.dataplane.context import Context
from service.engines.dispatch import EngineDispatcher
from service.observability.metrics import ServiceMetrics
from service.settings import Settings
from tests.hardening.conftest import metric_value


@dataclass
class Choice:
    name: str
    provider: str


class FakeDispatcher:
    def run(self, task: Any, requested: str, admit: Any) -> tuple[str, Choice]:
        return "forward", Choice("numpy", "CPU/numpy")

    def run_backward(self, task: Any, requested: str, admit: Any) -> tuple[str, Choice]:
        return "backward", Choice("onnx", "CPUExecutionProvider")


def context(metrics: ServiceMetrics) -> Context:
    settings = Settings(enable_onnx=False)
    return Context.from_settings(settings, cast(EngineDispatcher, FakeDispatcher()), metrics)


def task(normalizer: str) -> AttentionTask:
    q = np.zeros((1, 2))
    return AttentionTask(AttentionInputs(q, q, q), AttentionParams(normalizer=normalizer))


def test_runs_are_labelled_by_model_and_normalizer() -> None:
    metrics = ServiceMetrics()
    ctx = context(metrics)
    assert ctx.run_engine("attention", task("sparsemax"), "auto", lambda e, t: None)[0] == "forward"
    # A backward task carries its forward task: the normalizer is found there.
    backward = BackwardTask(task=task("entmax15"), grad_output=np.zeros((1, 2)))
    assert ctx.run_engine("attention_backward", backward, "onnx", lambda e, t: None)[0] == "backward"
    text = metrics.exposition().decode()
    labels = {"engine": "numpy", "provider": "CPU/numpy", "model": "attention", "normalizer": "sparsemax"}
    assert metric_value(text, "attn_engine_compute_seconds_count", **labels) == 1
    labels = {"engine": "onnx", "provider": "CPUExecutionProvider", "model": "attention_backward"}
    assert metric_value(text, "attn_engine_compute_seconds_count", **labels, normalizer="entmax15") == 1


def test_the_normalizer_label_is_bounded() -> None:
    metrics = ServiceMetrics()
    ctx = context(metrics)
    for name in (*NORMALIZERS, "x" * 100):
        ctx.run_engine("attention", task(name), "auto", lambda e, t: None)
    text = metrics.exposition().decode()
    labels = {"engine": "numpy", "provider": "CPU/numpy", "model": "attention"}
    for name in NORMALIZERS:
        assert metric_value(text, "attn_engine_compute_seconds_count", **labels, normalizer=name) == 1
    assert metric_value(text, "attn_engine_compute_seconds_count", **labels, normalizer="other") == 1


def test_served_request_records_its_normalizer() -> None:
    app = create_app(Settings(enable_onnx=False))
    body = {"query": [[1.0, 0.0]], "key": [[1.0, 0.0], [0.0, 1.0]], "value": [[1.0], [2.0]], "normalizer": "sparsemax"}
    with TestClient(app) as client:
        assert client.post("/v1/attention", json=body).status_code == 200
        text = client.get("/metrics").text
    labels = {"engine": "numpy", "provider": "CPU/numpy", "model": "attention", "normalizer": "sparsemax"}
    assert metric_value(text, "attn_engine_compute_seconds_count", **labels) == 1


def test_model_label_is_bounded() -> None:
    from service.observability.metrics import model_label

    models = frozenset({"attention", "softmax"})
    assert model_label("/v1/attention", "/v1/attention", models) == "attention"
    assert model_label("/v1/attention/backward", "/v1/attention/backward", models) == "attention_backward"
    assert model_label("/v2/models/{model_name}/infer", "/v2/models/softmax/infer", models) == "softmax"
    assert model_label("/v2/models/{model_name}/ready", "/v2/models/" + "x" * 300 + "/ready", models) == "other"
    assert model_label("/healthz", "/healthz", models) == ""


def test_requests_by_model_with_body_sizes() -> None:
    app = create_app(Settings(enable_onnx=False))
    v2 = {
        "inputs": [
            {"name": "logits", "shape": [1, 3], "datatype": "FP32", "data": [1.0, 2.0, 3.0]},
        ]
    }
    with TestClient(app) as client:
        assert app.state.runtime.startup_done.wait(60)
        sent = client.post("/v2/models/softmax/infer", json=v2)
        assert sent.status_code == 200, sent.text
        assert client.post("/v2/models/nonesuch-" + "z" * 50 + "/infer", json=v2).status_code == 404
        text = client.get("/metrics").text
    route = "/v2/models/{model_name}/infer"
    assert metric_value(text, "attn_http_requests_total", route=route, model="softmax", status="200") == 1
    assert metric_value(text, "attn_http_requests_total", route=route, model="other", status="404") == 1
    assert "nonesuch" not in text  # a name the server does not have never becomes a label value
    request_bytes = len(sent.request.content)
    assert metric_value(text, "attn_http_request_size_bytes_count", route=route, model="softmax") == 1
    assert metric_value(text, "attn_http_request_size_bytes_sum", route=route, model="softmax") == request_bytes
    assert metric_value(text, "attn_http_response_size_bytes_sum", route=route, model="softmax") == len(sent.content)


def test_probes_and_scrapes_are_logged_at_debug(caplog: pytest.LogCaptureFixture) -> None:
    app = create_app(Settings(enable_onnx=False))
    caplog.set_level(logging.DEBUG, logger="service.access")
    with TestClient(app) as client:
        for path in ("/healthz", "/readyz", "/metrics", "/v2/health/live"):
            client.get(path)
        client.post("/v1/softmax", json={"logits": [1.0, 2.0]})
    levels = {r.path: r.levelno for r in caplog.records if r.name == "service.access"}  # type: ignore[attr-defined]
    assert levels == {
        "/healthz": logging.DEBUG,
        "/readyz": logging.DEBUG,
        "/metrics": logging.DEBUG,
        "/v2/health/live": logging.DEBUG,
        "/v1/softmax": logging.INFO,
    }, levels
