"""The plain Starlette routes in front of the data plane answer exactly as the FastAPI routes behind them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient
from starlette.routing import Match, Route

from service.api import v1
from service.api.fast_routes import FAST_ROUTES
from service.app import create_app
from service.settings import Settings

Q = [[[[0.1, 0.2], [0.3, -0.4]]]]
ATTENTION = {"query": Q, "key": Q, "value": Q, "return": ["output", "weights", "diagnostics"]}


def _v2(inputs: list[dict[str, Any]], **parameters: Any) -> dict[str, Any]:
    return {"inputs": inputs, "parameters": parameters}


V2_ATTENTION = _v2(
    [
        {"name": n, "shape": [1, 1, 2, 2], "datatype": "FP32", "data": [0.1, 0.2, 0.3, -0.4]}
        for n in ("query", "key", "value")
    ]
)

# (method, path, JSON body): valid requests and each kind of refusal the endpoints give
CASES: list[tuple[str, str, Any]] = [
    ("POST", "/v1/attention", ATTENTION),
    ("POST", "/v1/attention", {**ATTENTION, "normalizer": "entmax", "alpha": 1.3, "causal": True}),
    ("POST", "/v1/attention", {**ATTENTION, "query": [[[[1.0, "x"]]]]}),  # 422, names the index
    ("POST", "/v1/attention", {"query": Q}),  # 422, missing fields
    ("POST", "/v1/attention", [1, 2]),  # 422, not an object
    ("GET", "/v1/attention", None),  # 405
    ("POST", "/v1/softmax", {"logits": [[1.0, 2.0, 3.0]], "normalizer": "sparsemax"}),
    ("POST", "/v1/softmax", {"logits": [[1.0, 2.0, 3.0]], "temperature": -1}),  # 422
    ("POST", "/v2/models/attention/infer", V2_ATTENTION),
    ("POST", "/v2/models/attention/versions/1/infer", V2_ATTENTION),
    ("POST", "/v2/models/attention/versions/7/infer", V2_ATTENTION),  # 404, unknown version
    ("POST", "/v2/models/nope/infer", V2_ATTENTION),  # 404, unknown model
    ("POST", "/v2/models/attention/infer", _v2(V2_ATTENTION["inputs"][:1])),  # 400, missing inputs
    (
        "POST",
        "/v2/models/softmax/infer",
        _v2([{"name": "logits", "shape": [3], "datatype": "FP64", "data": [1, 2, 3]}]),
    ),
    ("GET", "/v2/models/attention/infer", None),  # 405
]


def _without_fast_routes() -> Any:
    app = create_app(Settings(enable_onnx=False))
    app.router.routes[:] = [r for r in app.router.routes if r not in FAST_ROUTES]
    return app


@pytest.fixture(scope="module")
def clients() -> Iterator[tuple[TestClient, TestClient]]:
    with (
        TestClient(create_app(Settings(enable_onnx=False)), raise_server_exceptions=False) as fast,
        TestClient(_without_fast_routes(), raise_server_exceptions=False) as slow,
    ):
        yield fast, slow


def _comparable(body: Any) -> Any:
    """The answer without what changes from one run to the next (timings)."""
    if isinstance(body, dict):
        return {k: _comparable(v) for k, v in body.items() if k != "timing_ms"}
    if isinstance(body, list):
        return [_comparable(v) for v in body]
    return body


@pytest.mark.parametrize(("method", "path", "body"), CASES)
def test_same_answer_as_the_fastapi_route(
    clients: tuple[TestClient, TestClient], method: str, path: str, body: Any
) -> None:
    fast, slow = clients
    answers = [c.request(method, path, json=body) for c in (fast, slow)]
    a, b = answers
    assert a.status_code == b.status_code
    assert a.headers["content-type"] == b.headers["content-type"]
    assert a.headers.get("allow") == b.headers.get("allow")
    if a.headers["content-type"].startswith("application/json") and a.status_code == 200:
        assert _comparable(a.json()) == _comparable(b.json())
    else:
        assert a.json() == b.json()


def test_fast_routes_match_first_and_reuse_the_endpoints() -> None:
    app = create_app(Settings(enable_onnx=False))
    scope = {"type": "http", "method": "POST", "path": "/v1/attention", "root_path": ""}
    first = next(r for r in app.router.routes if r.matches(scope)[0] == Match.FULL)
    assert type(first) is Route and first.endpoint is v1.post_attention
    documented = [r for r in v1.router.routes if isinstance(r, APIRoute) and r.path == "/v1/attention"]
    assert documented and documented[0].endpoint is v1.post_attention
    schema_paths = app.openapi()["paths"]
    for route in FAST_ROUTES:
        assert route.path in schema_paths  # documented by the FastAPI route behind it
        assert route.include_in_schema is False
