"""One error model: problem+json on every non-/v2 path (middleware answers included), the protocol's
``{"error": ...}`` under /v2, and a logged 500 with no internals for a bug.
"""

from __future__ import annotations

import logging

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from tests.hardening.conftest import ATTENTION, BrokenEngine, client_for, metric_value, settings
from tests.http.conftest import assert_problem


def test_unknown_path_and_wrong_method_are_problems() -> None:
    with client_for() as c:
        assert_problem(c.get("/no/such/path"), 404)
        r = c.get("/v1/attention")
        assert_problem(r, 405)
        assert "POST" in r.headers["allow"]


def test_v2_paths_keep_the_protocol_error_body() -> None:
    with client_for() as c:
        r = c.get("/v2/no/such/path")
        assert r.status_code == 404 and r.headers["content-type"] == "application/json"
        assert set(r.json()) == {"error"}


def test_an_engine_bug_is_a_logged_500_without_internals(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    with client_for(BrokenEngine()) as c:
        r = c.post("/v1/attention", json=ATTENTION, headers={"x-request-id": "bug-report-42"})
        body = assert_problem(r, 500)
        assert body["type"].endswith("/internal-error")
        assert "bug-report-42" in body["detail"] and r.headers["x-request-id"] == "bug-report-42"
        for secret in ("secret", "/srv", "deadbeef", "RuntimeError", "Traceback"):
            assert secret not in r.text
        assert r.headers["x-content-type-options"] == "nosniff"  # security headers on the 500 too
        assert (
            metric_value(
                c.get("/metrics").text, "attn_http_requests_total", method="POST", route="/v1/attention", status="500"
            )
            == 1
        )
    errors = [rec for rec in caplog.records if rec.name == "service.errors"]
    assert len(errors) == 1 and errors[0].exc_info is not None
    assert "secret internals" in str(errors[0].exc_info[1])  # the details go to the log, not to the client
    access = [rec for rec in caplog.records if rec.name == "service.access" and rec.request_id == "bug-report-42"]
    assert [rec.status for rec in access] == [500]


def test_a_named_engine_that_crashes_is_a_500_and_auto_falls_back() -> None:
    from service.engines.numpy_engine import NumpyEngine

    class BrokenOnnx(BrokenEngine):
        name = "onnx"

    app = create_app(
        settings(inline_max_body_bytes=0, auto_numpy_max_scores=0),
        engines={"onnx": BrokenOnnx(), "numpy": NumpyEngine()},
    )
    with TestClient(app, raise_server_exceptions=False) as c:
        named = c.post("/v1/attention", json={**ATTENTION, "engine": "onnx"})
        assert_problem(named, 500)  # the server's fault, not the client's: never a 4xx
        assert "secret" not in named.text
        auto = c.post("/v1/attention", json=ATTENTION)
        assert auto.status_code == 200 and auto.json()["engine"]["name"] == "numpy"
        assert "onnx failed (RuntimeError, logged)" in auto.json()["engine"]["reason"] and "secret" not in auto.text


@pytest.mark.parametrize(("path", "problem"), [("/v1/boom", True), ("/v2/boom", False)])
def test_any_route_bug_is_a_500_in_the_paths_format(path: str, problem: bool) -> None:
    app = create_app(settings())

    async def boom() -> None:
        raise KeyError("internal state")

    app.add_api_route(path, boom)
    with TestClient(app, raise_server_exceptions=False) as c:
        r = c.get(path)
    assert r.status_code == 500 and "internal state" not in r.text
    if problem:
        assert_problem(r, 500)
    else:
        assert r.headers["content-type"] == "application/json" and set(r.json()) == {"error"}
