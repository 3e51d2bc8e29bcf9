"""An app on the numpy engine only, for the HTTP tests of the /v1 API."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.settings import Settings


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    app = create_app(Settings(enable_onnx=False))
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


def assert_problem(response, status: int, *, loc: list | None = None, detail: str | None = None) -> dict:
    """The response is an RFC 9457 problem with this status (and location/detail when given)."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    body = response.json()
    assert body["status"] == status and body["title"] and body["type"].startswith("https://")
    assert isinstance(body["detail"], str) and body["detail"]
    if detail is not None:
        assert detail in body["detail"], body["detail"]
    if loc is not None:
        assert any(e["loc"] == loc for e in body["errors"]), body["errors"]
    return body
