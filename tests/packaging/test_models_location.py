"""Where the server finds its ONNX graphs, and what a 503 may say about it (service/models_location.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from service import models_location
from service.app import create_app
from service.models_location import MANIFEST_NAME, checkout_models_dir, default_export_dir, default_models_dir
from service.settings import Settings

REPO = Path(__file__).resolve().parents[2]


def test_checkout_uses_the_repository_models() -> None:
    # This suite runs from a checkout (editable install): the package folder has no models/.
    assert checkout_models_dir() == REPO / "models"
    assert default_models_dir() == REPO / "models"
    assert (default_models_dir() / MANIFEST_NAME).is_file()
    assert Settings().models_dir == REPO / "models"


def test_attn_models_dir_overrides(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ATTN_MODELS_DIR", str(tmp_path))
    assert Settings().models_dir == tmp_path


def test_packaged_copy_wins_over_a_checkout(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """An installed package (service/models with a manifest) is found through importlib.resources."""
    package = tmp_path / "site-packages" / "service"
    (package / "models").mkdir(parents=True)
    (package / "models" / MANIFEST_NAME).write_text(json.dumps({"graphs": []}))
    monkeypatch.setattr(models_location.resources, "files", lambda name: package)
    assert models_location.packaged_models_dir() == package / "models"
    assert default_models_dir() == package / "models"


def test_export_default_is_never_site_packages(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert default_export_dir() == REPO / "models"
    # Installed (no checkout around the package): ./models of the working directory.
    monkeypatch.setattr(models_location, "checkout_models_dir", lambda: None)
    monkeypatch.chdir(tmp_path)
    assert default_export_dir() == tmp_path / "models"


def test_a_503_does_not_show_the_models_path(tmp_path: Path) -> None:
    empty = tmp_path / "secret-location" / "models"
    empty.mkdir(parents=True)
    app = create_app(Settings(models_dir=empty))
    body = {"query": [[1.0, 0.0]], "key": [[1.0, 0.0]], "value": [[1.0, 2.0]], "engine": "onnx"}
    with TestClient(app, raise_server_exceptions=False) as client:
        app.state.runtime.startup_done.wait(60)
        response = client.post("/v1/attention", json=body)
        ready = client.get("/readyz")
    assert response.status_code == 503, response.text
    assert "manifest.json is missing" in response.text
    assert ready.status_code == 200 and ready.json()["degraded"] is True  # degraded mode: numpy serves
    for text in (response.text, ready.text):
        assert "secret-location" not in text and str(tmp_path) not in text, text


def test_an_unsupported_request_does_not_show_the_models_path(tmp_path: Path) -> None:
    import shutil

    models = tmp_path / "secret-location" / "models"
    shutil.copytree(REPO / "models", models)
    app = create_app(Settings(models_dir=models))
    q = [[[[1.0, 0.0], [0.0, 1.0]]]]
    body = {"query": q, "key": q, "value": q, "grad_output": q, "normalizer": "sparsemax", "engine": "onnx"}
    with TestClient(app, raise_server_exceptions=False) as client:
        assert app.state.runtime.startup_done.wait(120)
        assert app.state.runtime.engines["onnx"].ready
        response = client.post("/v1/attention/backward", json=body)
    assert response.status_code in (422, 503), response.text
    assert "no ONNX backward graph serves normalizer sparsemax" in response.text
    assert "secret-location" not in response.text and str(tmp_path) not in response.text
