"""Degraded mode (issue 13, item 13): a corrupted ONNX graph leaves the service ready on numpy, says so,
and never shows a server path or a hash; ``ATTN_ONNX_REQUIRED=true`` makes it fail readiness instead.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.settings import Settings
from tests.hardening.conftest import metric_value
from tests.http.conftest import assert_problem

VICTIM = "softmax_fused_nomask_f32.onnx"
ATTENTION = {"query": [[1.0, 0.0]], "key": [[1.0, 0.0], [0.0, 1.0]], "value": [[1.0], [2.0]]}
V2_ATTENTION = {
    "inputs": [
        {"name": "query", "shape": [1, 2], "datatype": "FP32", "data": [1.0, 0.0]},
        {"name": "key", "shape": [2, 2], "datatype": "FP32", "data": [1.0, 0.0, 0.0, 1.0]},
        {"name": "value", "shape": [2, 1], "datatype": "FP32", "data": [1.0, 2.0]},
    ]
}
V2_SOFTMAX = {"inputs": [{"name": "logits", "shape": [2], "datatype": "FP32", "data": [1.0, 2.0]}]}
OUTPUT = 0.6697615 * 1.0 + 0.3302385 * 2.0  # softmax([1/sqrt 2, 0]) . [1, 2]


def corrupted_models(tmp_path: Path) -> tuple[Path, str]:
    """A copy of models/ with one byte of one graph flipped; returns the folder and the file's new sha256."""
    models = tmp_path / "models"
    shutil.copytree(Settings().models_dir, models)
    victim = models / VICTIM
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x01
    victim.write_bytes(bytes(data))
    return models, hashlib.sha256(bytes(data)).hexdigest()


def hashes_of(models: Path) -> list[str]:
    manifest = json.loads((models / "manifest.json").read_text())
    return [g["sha256"] for g in manifest["graphs"]]


def assert_nothing_private(text: str, models: Path, secrets: list[str]) -> None:
    """No server path and no hash in an answer."""
    assert str(models) not in text and str(models.parent) not in text, text
    assert not re.search(r"[0-9a-f]{32,}", text), text
    for secret in secrets:
        assert secret not in text


@pytest.fixture
def degraded(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> Iterator[tuple[TestClient, Path, list[str]]]:
    models, digest = corrupted_models(tmp_path)
    caplog.set_level(logging.INFO, logger="service")
    app = create_app(Settings(models_dir=models))
    with TestClient(app, raise_server_exceptions=False) as c:
        assert app.state.runtime.startup_done.wait(60)
        yield c, models, [digest, *hashes_of(models)]


def test_degraded_mode_is_ready_and_says_which_engine_failed_and_why(degraded, caplog) -> None:
    c, models, secrets = degraded
    r = c.get("/readyz")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["ready"] is True and body["degraded"] is True and body["status"] == "degraded"
    assert body["engines"] == {"numpy": True, "onnx": False} and body["required"] == ["numpy"]
    assert VICTIM in body["failed"]["onnx"] and "corrupted" in body["failed"]["onnx"]
    assert_nothing_private(r.text, models, secrets)

    r = c.get("/v1/engines")
    assert r.status_code == 200
    engines = {e["name"]: e for e in r.json()["engines"]}
    assert r.json()["degraded"] is True and VICTIM in r.json()["failed"]["onnx"]
    onnx = engines["onnx"]
    assert onnx["status"] == "failed" and onnx["ready"] is False and onnx["required"] is False
    assert VICTIM in onnx["failure"] and onnx["models_source"] == "ATTN_MODELS_DIR"
    assert engines["numpy"]["ready"] is True and engines["numpy"]["required"] is True
    assert_nothing_private(r.text, models, secrets)

    r = c.get("/v1/models")
    assert r.status_code == 200 and r.json()["verified"] is False
    assert all("sha256" not in g for g in r.json()["models"]) and "models_dir" not in r.json()
    assert_nothing_private(r.text, models, secrets)

    # one log line records it, with what only the operator needs (the folder, the hashes)
    records = caplog.get_records("setup") + caplog.records  # start-up ran while the fixture set up
    lines = [rec for rec in records if rec.levelno >= logging.ERROR and "failed to start" in rec.getMessage()]
    assert len(lines) == 1, [rec.getMessage() for rec in lines]
    message = lines[0].getMessage()
    assert "engine onnx failed to start" in message and VICTIM in message and "degraded mode" in message
    assert secrets[0] in message and str(models) in message

    text = c.get("/metrics").text
    assert metric_value(text, "attn_engine_ready", engine="onnx") == 0
    assert metric_value(text, "attn_engine_ready", engine="numpy") == 1


def test_degraded_mode_serves_every_route_through_numpy(degraded) -> None:
    c, models, secrets = degraded
    r = c.post("/v1/attention", json=ATTENTION)
    assert r.status_code == 200, r.text
    assert r.json()["engine"]["name"] == "numpy" and r.json()["output"][0][0] == pytest.approx(OUTPUT, rel=1e-6)
    assert_nothing_private(r.text, models, secrets)
    big = {"query": [[0.5] * 8] * 64, "key": [[0.25] * 8] * 128, "value": [[1.0] * 8] * 128, "return": ["output"]}
    r = c.post("/v1/attention", json=big)  # large enough that auto would pick ONNX
    assert r.status_code == 200 and r.json()["engine"]["name"] == "numpy" and "onnx is not ready" in r.text
    assert_nothing_private(r.text, models, secrets)
    assert c.post("/v1/softmax", json={"logits": [1.0, 2.0]}).status_code == 200

    for path in ("/v2/health/ready", "/v2/models/attention/ready", "/v2/models/softmax/ready"):
        assert c.get(path).status_code == 200, path
    r = c.post("/v2/models/softmax/infer", json=V2_SOFTMAX)
    assert r.status_code == 200, r.text
    assert r.json()["outputs"][0]["data"] == pytest.approx([0.26894142, 0.73105858], rel=1e-6)
    r = c.post("/v2/models/attention/infer", json=V2_ATTENTION)
    assert r.status_code == 200, r.text
    assert r.json()["parameters"]["engine"] == "numpy"
    assert r.json()["outputs"][0]["data"] == pytest.approx([OUTPUT], rel=1e-6)


def test_asking_for_the_failed_engine_is_a_clear_503(degraded) -> None:
    c, models, secrets = degraded
    r = c.post("/v1/attention", json={**ATTENTION, "engine": "onnx"})
    body = assert_problem(r, 503, detail="the ONNX engine failed to start")
    assert VICTIM in body["detail"] and "'auto'" in body["detail"] and "numpy" in body["detail"]
    assert "retry-after" not in r.headers  # it stays failed: retrying cannot help
    assert_nothing_private(r.text, models, secrets)
    r = c.post("/v2/models/attention/infer", json={**V2_ATTENTION, "parameters": {"engine": "onnx"}})
    assert r.status_code == 503 and "failed to start" in r.json()["error"], r.text
    assert_nothing_private(r.text, models, secrets)


def test_onnx_required_makes_a_broken_graph_fail_readiness(tmp_path: Path, caplog) -> None:
    models, digest = corrupted_models(tmp_path)
    caplog.set_level(logging.INFO, logger="service")
    app = create_app(Settings(models_dir=models, onnx_required=True))
    with TestClient(app, raise_server_exceptions=False) as c:
        assert app.state.runtime.startup_done.wait(60)
        r = c.get("/readyz")
        assert r.status_code == 503 and r.headers["retry-after"]
        body: dict[str, Any] = r.json()
        assert body["ready"] is False and body["degraded"] is False and body["required"] == ["numpy", "onnx"]
        assert VICTIM in body["failed"]["onnx"]
        assert_nothing_private(r.text, models, [digest, *hashes_of(models)])
        assert c.get("/v2/health/ready").status_code == 503
        r = c.post("/v2/models/softmax/infer", json=V2_SOFTMAX)
        assert r.status_code == 503 and "not ready" in r.json()["error"]
        assert_nothing_private(r.text, models, [digest, *hashes_of(models)])
    lines = [rec.getMessage() for rec in caplog.records if "failed to start" in rec.getMessage()]
    assert len(lines) == 1 and "ATTN_ONNX_REQUIRED=true" in lines[0] and "not ready" in lines[0], lines


def test_healthy_service_is_ready_and_not_degraded() -> None:
    app = create_app(Settings())
    with TestClient(app, raise_server_exceptions=False) as c:
        assert app.state.runtime.startup_done.wait(60)
        body = c.get("/readyz").json()
        assert body["status"] == "ready" and body["degraded"] is False and "failed" not in body
        assert body["engines"] == {"numpy": True, "onnx": True}
        assert metric_value(c.get("/metrics").text, "attn_engine_ready", engine="onnx") == 1
