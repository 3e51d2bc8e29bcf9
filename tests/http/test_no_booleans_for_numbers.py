"""A boolean is not a number: true/false for a float option is a 422 naming the field (pydantic's lax mode read
them as 1.0/0.0; schemathesis found `"min_p": false` accepted). Integers stay welcome.
"""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.settings import Settings
from tests.http.conftest import assert_problem

Q = [[1.0, 0.0], [0.0, 1.0]]
CASES = [
    ("/v1/softmax", {"logits": [1.0, 2.0]}, "temperature"),
    ("/v1/attention", {"query": Q, "key": Q, "value": Q}, "scale"),
    ("/v1/attention", {"query": Q, "key": Q, "value": Q, "normalizer": "entmax"}, "alpha"),
    ("/v1/sample", {"logits": [1.0, 2.0]}, "min_p"),
    ("/v1/sample", {"logits": [1.0, 2.0]}, "top_p"),
    ("/v1/sample", {"logits": [1.0, 2.0]}, "repetition_penalty"),
    ("/v1/attention/analyze", {"shape": [1, 1, 4, 4]}, "vanishing_threshold"),
]


@pytest.fixture(scope="module")
def client():  # type: ignore[no-untyped-def]
    with TestClient(create_app(Settings(enable_onnx=False))) as c:
        yield c


@pytest.mark.parametrize(("path", "body", "field"), CASES, ids=[f"{p}:{f}" for p, _, f in CASES])
def test_a_boolean_for_a_number_is_422(client, path, body, field) -> None:  # type: ignore[no-untyped-def]
    assert_problem(client.post(path, json={**body, field: True}), 422, loc=[field])


def test_integers_are_numbers(client) -> None:  # type: ignore[no-untyped-def]
    assert client.post("/v1/softmax", json={"logits": [1.0, 2.0], "temperature": 2}).status_code == 200
    assert client.post("/v1/sample", json={"logits": [1.0, 2.0], "top_p": 1, "seed": 1}).status_code == 200
