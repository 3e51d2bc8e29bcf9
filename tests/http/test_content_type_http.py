"""Content types (issue 13, item 10): every /v1 POST takes JSON only; Inference-Header-Content-Length is digits."""

from __future__ import annotations

import json
import time

import pytest
from fastapi.testclient import TestClient

from service.http.bodies import is_json_media_type
from tests.http.conftest import assert_problem

ATTENTION = {"query": [[1.0, 0.0]], "key": [[1.0, 0.0], [0.0, 1.0]], "value": [[1.0], [2.0]]}
SOFTMAX = {"logits": [1.0, 2.0]}
NOT_JSON = [
    "text/plain",
    "text/plain; charset=utf-8",
    "multipart/form-data; boundary=x",
    "application/x-www-form-urlencoded",
    "application/octet-stream",
    "application/xml",
    "text/json",
    "application/json-seq",
    "application/json; charset=latin-1",
    "",
]
JSON = ["application/json", "application/json; charset=utf-8", "Application/JSON", "application/vnd.api+json"]


def v1_post_paths(client: TestClient) -> list[str]:
    """Every POST route under /v1 the app serves, including those other modules add."""
    paths = client.get("/openapi.json").json()["paths"]
    return sorted(p for p, ops in paths.items() if p.startswith("/v1/") and "post" in ops)


def test_the_app_has_several_v1_post_routes(client) -> None:
    paths = v1_post_paths(client)
    assert {"/v1/attention", "/v1/softmax"} <= set(paths)


@pytest.mark.parametrize("content_type", NOT_JSON)
def test_every_v1_post_route_refuses_non_json_with_415(client, content_type) -> None:
    for path in v1_post_paths(client):
        r = client.post(path, content=json.dumps(ATTENTION), headers={"content-type": content_type})
        body = assert_problem(r, 415, detail="is not supported")
        assert "application/json" in body["detail"], (path, body)
        assert r.headers["accept-post"] == "application/json"


def test_multipart_upload_is_415(client) -> None:
    r = client.post("/v1/attention", files={"query": ("q.json", b"[[1.0]]", "application/json")})
    assert_problem(r, 415, detail="multipart/form-data")


@pytest.mark.parametrize("content_type", JSON)
def test_json_media_types_are_accepted(client, content_type) -> None:
    r = client.post("/v1/attention", content=json.dumps(ATTENTION), headers={"content-type": content_type})
    assert r.status_code == 200, r.text
    assert r.json()["output"][0] == pytest.approx([1.3302385], rel=1e-6)
    r = client.post("/v1/softmax", content=json.dumps(SOFTMAX), headers={"content-type": content_type})
    assert r.status_code == 200, r.text


def test_missing_content_type_is_read_as_json(client) -> None:
    r = client.post("/v1/softmax", content=json.dumps(SOFTMAX).encode())
    assert "content-type" not in r.request.headers
    assert r.status_code == 200, r.text
    assert r.json()["probabilities"] == pytest.approx([0.26894142, 0.73105858], rel=1e-6)
    assert_problem(client.post("/v1/softmax", content=b"logits=1,2"), 422, detail="not valid JSON")


def test_media_type_rule() -> None:
    assert is_json_media_type('application/json; charset="UTF-8"')
    assert is_json_media_type("application/problem+json")
    assert not is_json_media_type("application/jsonx")
    assert not is_json_media_type("text/plain+json")
    assert not is_json_media_type("application/json; charset=utf-16")


def wait_ready(client: TestClient) -> None:
    """/v2 inference answers 503 until start-up is over (the shared client does not wait for it)."""
    deadline = time.monotonic() + 30
    while client.get("/v2/health/ready").status_code != 200:
        assert time.monotonic() < deadline, "the app never became ready"
        time.sleep(0.01)


def test_v2_still_takes_octet_stream_and_json(client) -> None:
    wait_ready(client)
    infer = {"inputs": [{"name": "logits", "shape": [2], "datatype": "FP32", "data": [1.0, 2.0]}]}
    for content_type in ("application/json", "application/octet-stream"):
        r = client.post("/v2/models/softmax/infer", content=json.dumps(infer), headers={"content-type": content_type})
        assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    "value", ["+346", "3_4_6", "-1", " 0x10", "1e2", "\u0663\u0664".encode(), "34 6", "", "\u00b2".encode("latin-1")]
)
def test_inference_header_content_length_takes_plain_digits_only(client, value) -> None:
    wait_ready(client)
    infer = json.dumps({"inputs": [{"name": "logits", "shape": [2], "datatype": "FP32", "data": [1.0, 2.0]}]})
    r = client.post(
        "/v2/models/softmax/infer",
        content=infer.encode(),
        headers={"content-type": "application/octet-stream", "inference-header-content-length": value},
    )
    assert r.status_code == 400, r.text
    assert "Inference-Header-Content-Length" in r.json()["error"]
    ok = client.post(
        "/v2/models/softmax/infer",
        content=infer.encode(),
        headers={"content-type": "application/octet-stream", "inference-header-content-length": str(len(infer))},
    )
    assert ok.status_code == 200, ok.text
