"""/v2 JSON ``data`` (issue 28): the nesting the protocol allows.

Nested ``data`` is the tensor's own nested form or flat (row-major), nothing in between: a matrix sent as its
transpose was read again in row-major order and answered with a wrong output.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.settings import Settings

INFER = "/v2/models/attention/infer"
PAD = 40 << 10  # whitespace that takes a body past the small-body parser: its data is read from the bytes

# The issue's body: key declared [3, 2] and nested as its transpose.
MISNESTED: dict[str, Any] = {
    "inputs": [
        {"name": "query", "shape": [1, 2], "datatype": "FP64", "data": [1.0, 2.0]},
        {"name": "key", "shape": [3, 2], "datatype": "FP64", "data": [[1.0, 0.0, 1.0], [0.0, 1.0, 1.0]]},
        {"name": "value", "shape": [3, 2], "datatype": "FP64", "data": [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]},
    ]
}
KEY = [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    app = create_app(Settings(enable_onnx=False))
    with TestClient(app, raise_server_exceptions=False) as c:
        deadline = time.monotonic() + 10
        while c.get("/v2/health/ready").status_code != 200:
            assert time.monotonic() < deadline, "the app never became ready"
            time.sleep(0.01)
        yield c


def post(client: TestClient, body: dict[str, Any], pad: bool):
    raw = json.dumps(body).encode() + (b" " * PAD if pad else b"")
    return client.post(INFER, content=raw, headers={"Content-Type": "application/json"})


def error(r) -> str:
    assert r.status_code == 400, r.text
    return r.json()["error"]


def with_key(data: Any) -> dict[str, Any]:
    body = json.loads(json.dumps(MISNESTED))
    body["inputs"][1]["data"] = data
    return body


@pytest.mark.parametrize("pad", [False, True], ids=["small-body", "large-body"])
def test_the_issues_transposed_key_is_refused_naming_the_nesting(client: TestClient, pad: bool) -> None:
    message = error(post(client, MISNESTED, pad))
    assert "'key'" in message and "[3, 2]" in message and "nested as [2, 3]" in message, message


@pytest.mark.parametrize("pad", [False, True], ids=["small-body", "large-body"])
def test_an_extra_level_of_nesting_is_refused(client: TestClient, pad: bool) -> None:
    message = error(post(client, with_key([KEY]), pad))
    assert "'key'" in message and "[3, 2]" in message and "nested as [1, 3, 2]" in message, message


@pytest.mark.parametrize("pad", [False, True], ids=["small-body", "large-body"])
def test_flat_and_exactly_nested_data_give_the_same_output(client: TestClient, pad: bool) -> None:
    flat = post(client, with_key([x for row in KEY for x in row]), pad)
    nested = post(client, with_key(KEY), pad)
    assert flat.status_code == 200 and nested.status_code == 200, (flat.text, nested.text)
    out_flat, out_nested = flat.json()["outputs"][0], nested.json()["outputs"][0]
    assert out_flat["name"] == "output" and out_flat["data"] == out_nested["data"]
    # The rows as declared: scores [1, 2, 3] (scaled by 1/sqrt(2)), not the re-read rows [1,0], [1,0], [1,1].
    scores = np.array([1.0, 2.0, 3.0]) / np.sqrt(2.0)
    weights = np.exp(scores - scores.max()) / np.exp(scores - scores.max()).sum()
    np.testing.assert_allclose(out_flat["data"], weights @ np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]), rtol=1e-6)
