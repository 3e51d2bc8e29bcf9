"""HEAD on the health routes: the GET answer's status and headers, no body, no API key needed."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.engines.numpy_engine import NumpyEngine
from service.settings import Settings

HEALTH = ["/healthz", "/readyz", "/v2/health/live", "/v2/health/ready"]
KEY = "a-perfectly-good-key-0001"


class NeverReady(NumpyEngine):
    @property
    def ready(self) -> bool:
        return False


@pytest.mark.parametrize("path", HEALTH)
def test_head_answers_like_get_without_a_body(path: str) -> None:
    app = create_app(Settings(enable_onnx=False, api_keys=[KEY]))
    with TestClient(app) as client:
        assert app.state.runtime.startup_done.wait(60)
        get, head = client.get(path), client.head(path)
    assert head.status_code == get.status_code == 200
    assert head.content == b""
    assert head.headers["content-type"] == get.headers["content-type"]
    # The length of the body GET would send (/healthz's uptime may gain a digit between the two calls).
    assert abs(int(head.headers["content-length"]) - len(get.content)) <= (2 if path == "/healthz" else 0)


@pytest.mark.parametrize("path", ["/readyz", "/v2/health/ready"])
def test_head_says_503_while_not_ready(path: str) -> None:
    app = create_app(Settings(enable_onnx=False), engines={"numpy": NeverReady()})
    with TestClient(app) as client:
        assert app.state.runtime.startup_done.wait(60)
        head = client.head(path)
    assert head.status_code == 503 and head.headers["retry-after"] == "5" and head.content == b""


def test_head_is_not_in_the_schema() -> None:
    paths = create_app(Settings(enable_onnx=False)).openapi()["paths"]
    assert all(set(paths[p]) == {"get"} for p in HEALTH)
