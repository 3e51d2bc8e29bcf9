"""service.http.routing and the route table: one route per endpoint, the inference routes matched first, every
answer in its protocol's form.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from starlette.routing import Match

from service.app import create_app
from service.http.routing import RawRoute
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


def test_one_route_per_method_and_path() -> None:
    """One route table: no endpoint is registered twice (the hot routes are not a second, faster copy)."""
    app = create_app(Settings(enable_onnx=False))
    seen: set[tuple[str, str]] = set()
    for route in app.router.routes:
        for method in getattr(route, "methods", None) or ():
            key = (method, getattr(route, "path", ""))
            assert key not in seen, key
            seen.add(key)


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with TestClient(create_app(Settings(enable_onnx=False)), raise_server_exceptions=False) as c:
        yield c


EXPECTED = [200, 200, 422, 422, 422, 405, 200, 422, 200, 200, 404, 404, 400, 200, 405]


@pytest.mark.parametrize(("case", "status"), list(zip(CASES, EXPECTED, strict=True)))
def test_each_route_answers_in_its_protocol(client: TestClient, case: tuple[str, str, Any], status: int) -> None:
    method, path, body = case
    r = client.request(method, path, json=body)
    assert r.status_code == status, r.text
    if status >= 400 and status != 405:
        problem = path.startswith("/v1")
        want = "application/problem+json" if problem else "application/json"
        assert r.headers["content-type"] == want
        assert set(r.json()) >= ({"type", "title", "status", "detail"} if problem else {"error"})


def test_inference_routes_match_first_and_are_documented() -> None:
    app = create_app(Settings(enable_onnx=False))
    for method, path in (("POST", "/v1/attention"), ("POST", "/v2/models/attention/infer")):
        scope = {"type": "http", "method": method, "path": path, "root_path": ""}
        first = next(r for r in app.router.routes if r.matches(scope)[0] == Match.FULL)
        assert isinstance(first, RawRoute) and app.router.routes.index(first) < 4
    schema_paths = list(app.openapi()["paths"])
    assert schema_paths[:2] == ["/healthz", "/readyz"]  # the schema keeps its own order
    assert "/v1/attention" in schema_paths and "/v2/models/{model_name}/infer" in schema_paths
