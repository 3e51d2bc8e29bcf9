"""Bodies schemathesis found that once made the service answer 500; each must be a 422 naming the field."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.settings import Settings
from tests.http.conftest import assert_problem


@pytest.fixture(scope="module")
def client():  # type: ignore[no-untyped-def]
    with TestClient(create_app(Settings(enable_onnx=False)), raise_server_exceptions=False) as c:
        yield c


@pytest.mark.parametrize("dtype", [{}, [], ["float32"]], ids=["object", "empty-list", "list"])
def test_an_unhashable_dtype_is_422(client, dtype) -> None:  # type: ignore[no-untyped-def]
    tensor = {"shape": [2, 2], "dtype": dtype, "b64": ""}
    body = {"query": tensor, "key": [[1.0, 0.0]], "value": [[1.0]]}
    assert_problem(client.post("/v1/attention", json=body), 422, loc=["query", "dtype"])
    assert_problem(client.post("/v1/softmax", json={"logits": tensor}), 422, loc=["logits", "dtype"])
