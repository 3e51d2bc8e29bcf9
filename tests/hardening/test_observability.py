"""GET /metrics (Prometheus text, promtool-clean, multi-worker safe) and one JSON log line per request."""

from __future__ import annotations

import logging

import orjson
import pytest

from service.observability.logs import JsonFormatter, log_config
from tests.hardening.conftest import ATTENTION, SOFTMAX, client_for, metric_value, needs_promtool, promtool_check


def test_metrics_count_requests_by_route_template_and_status_and_time_the_engine() -> None:
    with client_for(inline_max_body_bytes=0) as c:  # all work in the thread pool, so each waits for a compute slot
        assert c.post("/v1/attention", json=ATTENTION).status_code == 200
        assert c.post("/v1/attention", json={"query": "nope"}).status_code == 422
        assert c.post("/v1/softmax", json=SOFTMAX).status_code == 200
        c.get("/v2/models/some-model")
        c.get("/definitely/not/a/route")
        r = c.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain; version=0.0.4")
    text = r.text
    assert metric_value(text, "attn_http_requests_total", method="POST", route="/v1/attention", status="200") == 1
    assert metric_value(text, "attn_http_requests_total", method="POST", route="/v1/attention", status="422") == 1
    assert metric_value(text, "attn_http_requests_total", method="GET", route="<unmatched>", status="404") == 1
    assert "/definitely" not in text and "some-model" not in text  # templates, never raw paths
    assert metric_value(text, "attn_http_request_duration_seconds_count", method="POST", route="/v1/softmax") == 1
    # body sizes from the middleware: the bytes read from the wire and the bytes sent
    body = len(orjson.dumps(SOFTMAX))
    assert metric_value(text, "attn_http_request_size_bytes_count", route="/v1/softmax") == 1
    assert metric_value(text, "attn_http_request_size_bytes_sum", route="/v1/softmax") == body
    assert metric_value(text, "attn_http_response_size_bytes_sum", route="/v1/softmax") > 0
    assert (
        metric_value(
            text,
            "attn_engine_compute_seconds_count",
            engine="numpy",
            provider="CPU/numpy",
            model="attention",
            normalizer="softmax",
        )
        == 1
    )
    assert metric_value(text, "attn_http_queue_wait_seconds_count") >= 3
    for reason in (
        "unauthorized",
        "body_too_large",
        "body_timeout",
        "queue_full",
        "queue_wait",
        "queue_timeout",
        "deadline",
    ):
        assert f'attn_http_requests_rejected_total{{reason="{reason}"}}' in text
    assert "attn_http_requests_in_flight 0.0" in text and "process_resident_memory_bytes" in text


@needs_promtool
def test_promtool_accepts_the_metrics() -> None:
    with client_for(max_concurrent_requests=1, max_queued_requests=0) as c:
        c.post("/v1/attention", json=ATTENTION)
        c.post("/v1/softmax", content=b"{", headers={"content-type": "application/json"})
        promtool_check(c.get("/metrics").text)


# -- request id and logs -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sent", "kept"),
    [
        ("abc-123_X.y:z", True),
        ("x" * 128, True),
        ("x" * 129, False),
        ("bad id", False),
        ("a\u00e9b", False),
        ("", False),
    ],
    ids=["safe", "longest", "too-long", "space", "non-ascii", "empty"],
)
def test_request_id_is_echoed_when_safe_and_generated_otherwise(sent: str, kept: bool) -> None:
    with client_for() as c:
        r = c.get("/healthz", headers={"x-request-id": sent.encode("utf-8")})
    got = r.headers["x-request-id"]
    if kept:
        assert got == sent
    else:
        assert got != sent and len(got) == 32 and int(got, 16) >= 0


def test_one_access_line_per_request_with_its_fields(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="service.access")
    with client_for() as c:
        c.post("/v1/softmax", json=SOFTMAX, headers={"x-request-id": "req-1"})
        c.get("/nope", headers={"x-request-id": "req-2"})
        c.post("/v1/softmax", json={"logits": "x"}, headers={"x-request-id": "req-3"})
    lines = [rec for rec in caplog.records if rec.name == "service.access"]
    assert [(rec.request_id, rec.status) for rec in lines][-3:] == [("req-1", 200), ("req-2", 404), ("req-3", 422)]
    line = orjson.loads(JsonFormatter().format(lines[-3]))
    assert {
        "ts",
        "level",
        "logger",
        "message",
        "method",
        "path",
        "status",
        "duration_ms",
        "request_id",
        "client",
    } <= set(line)
    assert line["method"] == "POST" and line["path"] == "/v1/softmax" and line["duration_ms"] > 0


def test_json_formatter_writes_one_object_per_line_with_the_traceback() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        import sys

        record = logging.LogRecord("service.errors", logging.ERROR, __file__, 1, "failed %s", ("here",), sys.exc_info())
    record.request_id = "r-9"
    text = JsonFormatter().format(record)
    assert "\n" not in text
    obj = orjson.loads(text)
    assert obj["message"] == "failed here" and obj["request_id"] == "r-9" and obj["level"] == "error"
    assert "ValueError: boom" in obj["exc_info"]


def test_log_config_routes_uvicorn_and_service_loggers_through_one_formatter() -> None:
    import logging.config

    config = log_config("warning", "json")
    logging.config.dictConfig(config)  # valid for dictConfig
    assert config["loggers"]["uvicorn.access"]["handlers"] == []  # replaced by service.access
    assert config["formatters"]["default"]["()"].endswith("JsonFormatter")
    logging.config.dictConfig(
        {
            "version": 1,
            "disable_existing_loggers": False,
            "loggers": {
                name: {"handlers": [], "propagate": True, "level": "NOTSET"}
                for name in ("uvicorn", "uvicorn.access", "service")
            },
        }
    )
