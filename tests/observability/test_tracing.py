"""OpenTelemetry tracing (service/http/tracing.py): off by default; on, a server span per request
continuing the caller's W3C traceparent, with decode, engine and encode child spans. Uses the SDK's
in-memory exporter (the `tracing` extra, installed by the `test` extra).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest.importorskip("opentelemetry.sdk.trace", reason="the tracing extra is not installed")
pytest.importorskip("opentelemetry.instrumentation.asgi", reason="the tracing extra is not installed")

from fastapi.testclient import TestClient
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from service.app import create_app
from service.observability import spans as phase_spans
from service.settings import Settings

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"
BODY = {"query": [[1.0, 0.0], [0.0, 1.0]], "key": [[1.0, 0.0], [0.0, 1.0]], "value": [[1.0, 2.0], [3.0, 4.0]]}
V2_BODY = {
    "inputs": [
        {"name": "query", "shape": [1, 2], "datatype": "FP32", "data": [1.0, 0.0]},
        {"name": "key", "shape": [2, 2], "datatype": "FP32", "data": [1.0, 0.0, 0.0, 1.0]},
        {"name": "value", "shape": [2, 2], "datatype": "FP32", "data": [1.0, 2.0, 3.0, 4.0]},
    ]
}


@pytest.fixture
def traced() -> Iterator[tuple[TestClient, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    app = create_app(Settings(enable_onnx=False, tracing=True), tracer_provider=provider)
    with TestClient(app) as client:
        assert app.state.runtime.startup_done.wait(60)  # /v2 answers 503 until the engines started
        yield client, exporter


def by_name(spans: tuple[ReadableSpan, ...]) -> dict[str, ReadableSpan]:
    return {s.name: s for s in spans}


def test_off_by_default_and_nothing_current() -> None:
    assert Settings.model_fields["tracing"].default is False
    assert phase_spans.CURRENT_TRACER.get() is None
    with phase_spans.span("engine"):  # a no-op without a tracer
        pass
    phase_spans.record_phases([("decode", 0.0, 1.0)])


def test_request_continues_the_callers_trace_with_phase_spans(traced) -> None:
    client, exporter = traced
    response = client.post("/v1/attention", json=BODY, headers={"traceparent": TRACEPARENT})
    assert response.status_code == 200, response.text
    spans = by_name(exporter.get_finished_spans())
    assert {"decode", "engine", "encode"} <= set(spans), sorted(spans)
    (server,) = [s for s in spans.values() if s.parent is not None and s.parent.span_id == int(PARENT_ID, 16)]
    # The server span joined the caller's trace (W3C traceparent) under the caller's span.
    assert format(server.context.trace_id, "032x") == TRACE_ID and server.parent.is_remote
    for name in ("decode", "engine", "encode"):
        child = spans[name]
        assert child.context.trace_id == server.context.trace_id
        assert child.parent is not None and child.parent.span_id == server.context.span_id, name
        assert server.start_time <= child.start_time <= child.end_time <= server.end_time, name
    # The phases follow each other: decode, then the engine, then encode.
    assert spans["decode"].end_time <= spans["engine"].start_time + 1_000_000
    assert spans["engine"].end_time <= spans["encode"].start_time + 1_000_000


def test_v2_inference_is_traced_and_starts_a_trace_without_traceparent(traced) -> None:
    client, exporter = traced
    response = client.post("/v2/models/attention/infer", json=V2_BODY)
    assert response.status_code == 200, response.text
    spans = exporter.get_finished_spans()
    names = {s.name for s in spans}
    assert {"decode", "engine", "encode"} <= names, names
    roots = [s for s in spans if s.parent is None]
    assert len(roots) == 1 and len({s.context.trace_id for s in spans}) == 1


def test_probes_and_metrics_are_not_traced(traced) -> None:
    client, exporter = traced
    for path in ("/healthz", "/readyz", "/metrics", "/v2/health/live"):
        client.get(path)
    assert exporter.get_finished_spans() == ()


def test_tracing_without_the_extra_refuses_to_start(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "opentelemetry.instrumentation.asgi", None)  # as if not installed
    with pytest.raises(RuntimeError, match=r"tracing extra"):
        create_app(Settings(enable_onnx=False, tracing=True))
