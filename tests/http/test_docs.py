"""The OpenAPI schema is one that SDK generators accept, documented with examples; /docs and /redoc need no CDN."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.http import examples
from service.http.docs import DOCS_ASSETS, HTTP_METHODS
from service.openapi import openapi_schema
from service.settings import Settings

KEY = "docs-tests-key-0123456789"


def _operations(schema: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (method, path, op)
        for path, item in schema["paths"].items()
        for method, op in item.items()
        if method in HTTP_METHODS
    ]


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    return openapi_schema()


def test_operation_ids_are_names(schema: dict[str, Any]) -> None:
    ids = {(m.upper(), p): op["operationId"] for m, p, op in _operations(schema)}
    assert ids[("POST", "/v1/attention")] == "attention" and ids[("POST", "/v1/softmax")] == "softmax"
    assert ids[("POST", "/v2/models/{model_name}/infer")] == "model_infer"
    assert len(set(ids.values())) == len(ids)
    for op_id in ids.values():
        assert re.fullmatch(r"[a-z][a-z0-9_]*", op_id) and not re.search(r"_(get|post)$", op_id), op_id


def test_every_array_has_items_and_tensors_are_one_ref(schema: dict[str, Any]) -> None:
    def walk(node: Any, where: str) -> None:
        if isinstance(node, dict):
            if node.get("type") == "array":
                assert "items" in node, f"array without items at {where}"
            for k, v in node.items():
                walk(v, f"{where}/{k}")
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{where}/{i}")

    walk(schema, "#")
    request = schema["components"]["schemas"]["AttentionRequest"]["properties"]
    for name in ("query", "key", "value"):
        assert request[name]["$ref"] == "#/components/schemas/Tensor"
    assert {"$ref": "#/components/schemas/Tensor"} in request["mask"]["anyOf"]
    response = schema["components"]["schemas"]["AttentionResponse"]["properties"]
    assert {"$ref": "#/components/schemas/OutputTensor"} in response["output"]["anyOf"]
    assert {"$ref": "#/components/schemas/Base64OutputTensor"} in schema["components"]["schemas"]["OutputTensor"][
        "anyOf"
    ]
    tensor = schema["components"]["schemas"]["Tensor"]["anyOf"]
    assert {"$ref": "#/components/schemas/Base64Tensor"} in tensor and {
        "$ref": "#/components/schemas/FlatTensor"
    } in tensor


def test_examples_on_every_request_and_answer(schema: dict[str, Any]) -> None:
    for method, path, op in _operations(schema):
        where = f"{method.upper()} {path}"
        for media_type, media in op.get("requestBody", {}).get("content", {}).items():
            if media_type != "application/octet-stream":
                assert "example" in media, f"{where}: request {media_type} needs an example (service/http/examples.py)"
        for status, response in op["responses"].items():
            for media_type, media in response.get("content", {}).items():
                if media_type != "application/octet-stream":
                    assert media.get("schema"), f"{where} {status} {media_type}: no schema"
                    assert "example" in media, f"{where} {status} {media_type}: no example (service/http/examples.py)"


def test_errors_are_problem_json_and_only_those_sent(schema: dict[str, Any]) -> None:
    for method, path, op in _operations(schema):
        responses = op["responses"]
        if path.startswith("/v2"):
            assert "422" not in responses, f"{method} {path}: /v2 answers invalid input with 400, never 422"
        for status, response in responses.items():
            if status.startswith("2"):
                continue
            content = response["content"]
            if path.startswith("/v2"):
                assert content["application/json"]["schema"] == {"$ref": "#/components/schemas/ProtocolError"}
            elif (path, status) == ("/readyz", "503"):  # the readiness details, as a 200 has them
                assert list(content) == ["application/json"]
            else:
                assert list(content) == ["application/problem+json"], f"{method} {path} {status}"
                assert content["application/problem+json"]["schema"] == {"$ref": "#/components/schemas/Problem"}
    assert "HTTPValidationError" not in schema["components"]["schemas"]
    assert "422" not in schema["paths"]["/healthz"]["get"]["responses"]
    assert {"400", "413", "415", "422", "503"} <= set(schema["paths"]["/v1/attention"]["post"]["responses"])


def test_v2_infer_is_typed(schema: dict[str, Any]) -> None:
    infer = schema["paths"]["/v2/models/{model_name}/infer"]["post"]
    assert infer["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/InferenceRequest"
    }
    ok = infer["responses"]["200"]["content"]
    assert ok["application/json"]["schema"] == {"$ref": "#/components/schemas/InferenceResponse"}
    assert "application/octet-stream" in ok
    inputs = schema["components"]["schemas"]["InferenceRequest"]["properties"]["inputs"]
    assert inputs["items"] == {"$ref": "#/components/schemas/RequestInput"}


def test_api_key_scheme_documented_always_applied_with_keys(schema: dict[str, Any]) -> None:
    assert set(schema["components"]["securitySchemes"]) == {"bearer", "apiKey"}
    assert all("security" not in op for _, _, op in _operations(schema))
    keyed = create_app(Settings(enable_onnx=False, api_keys=[KEY])).openapi()
    attention = keyed["paths"]["/v1/attention"]["post"]
    assert attention["security"] == [{"bearer": []}, {"apiKey": []}] and "401" in attention["responses"]
    assert "security" not in keyed["paths"]["/healthz"]["get"]  # exempt: probes
    assert "example" in attention["responses"]["401"]["content"]["application/problem+json"]


def _close(got: Any, want: Any, where: str = "") -> None:
    if isinstance(want, dict):
        assert isinstance(got, dict) and set(got) == set(want), where
        for k in want:
            if k not in ("timing_ms", "engine"):
                _close(got[k], want[k], f"{where}.{k}")
    elif isinstance(want, list) and want and isinstance(want[0], (list, float, int)) and not isinstance(want[0], bool):
        np.testing.assert_allclose(np.asarray(got, float), np.asarray(want, float), rtol=1e-6, atol=1e-7, err_msg=where)
    elif isinstance(want, list):  # of objects (analyze's sweep): each compared field by field
        assert isinstance(got, list) and len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            _close(g, w, f"{where}[{i}]")
    elif isinstance(want, float):
        assert got == pytest.approx(want, rel=1e-6, abs=1e-7), where
    else:
        assert got == want, where


def test_documented_examples_are_what_the_service_answers(schema: dict[str, Any]) -> None:
    with TestClient(create_app(Settings(enable_onnx=False))) as http:
        for path, op_id in (
            ("/v1/attention", "attention"),
            ("/v1/softmax", "softmax"),
            ("/v1/attention/backward", "attention_backward"),
            ("/v1/attention/analyze", "analyze"),
            ("/v1/attention/rollout", "attention_rollout"),
            ("/v1/sample", "sample"),
            ("/v1/calibrate", "calibrate"),
        ):
            got = http.post(path, json=examples.REQUEST_EXAMPLES[op_id])
            assert got.status_code == 200
            _close(got.json(), examples.RESPONSE_EXAMPLES[op_id], op_id)
            assert got.json()["timing_ms"].keys() == examples.RESPONSE_EXAMPLES[op_id]["timing_ms"].keys()
        sequence = f"/v1/sessions/{examples.SESSION_ID}"
        never = http.delete(sequence)  # the 404 example: a sequence this (fresh) app never started
        assert (never.status_code, never.json()["detail"]) == (404, examples.PROBLEM_DETAILS[404])
        got = http.post(f"{sequence}/steps", json=examples.REQUEST_EXAMPLES["session_step"])  # it starts it
        assert got.status_code == 200, got.text
        _close(got.json(), examples.RESPONSE_EXAMPLES["session_step"], "session_step")
        assert got.json()["timing_ms"].keys() == examples.RESPONSE_EXAMPLES["session_step"]["timing_ms"].keys()
        ended = http.delete(sequence)
        assert (ended.status_code, ended.json()) == (200, examples.RESPONSE_EXAMPLES["delete_session"])
        got = http.post("/v2/models/softmax/infer", json=examples.REQUEST_EXAMPLES["model_infer"]).json()
        want = examples.RESPONSE_EXAMPLES["model_infer"]
        assert {k: got[k] for k in ("model_name", "model_version", "id")} == {
            k: want[k] for k in ("model_name", "model_version", "id")
        }
        _close(got["outputs"], want["outputs"], "model_infer")
        for op_id, path in (
            ("healthz", "/healthz"),
            ("server_metadata", "/v2"),
            ("model_ready", "/v2/models/softmax/ready"),
        ):
            body = http.get(path).json()
            assert set(body) == set(examples.RESPONSE_EXAMPLES[op_id]), op_id
        assert http.get("/v2").json()["extensions"] == examples.RESPONSE_EXAMPLES["server_metadata"]["extensions"]
        stats = http.get("/v2/models/stats").json()["model_stats"]
        documented = examples.RESPONSE_EXAMPLES["all_model_statistics"]["model_stats"]
        assert [m["name"] for m in stats] == [m["name"] for m in documented]
        wrong = http.post("/v1/attention", json={**examples.ATTENTION_REQUEST, "temprature": 2}).json()
        assert wrong == {**wrong, "detail": examples.PROBLEM_DETAILS[422], "errors": examples.PROBLEM_ERRORS[422]}


def test_openapi_python_client_generates_every_endpoint(schema: dict[str, Any], tmp_path: Path) -> None:
    generator = shutil.which("openapi-python-client", path=str(Path(sys.executable).parent))
    assert generator, "openapi-python-client is a test dependency (pyproject.toml [test])"
    (tmp_path / "openapi.json").write_text(json.dumps(schema))
    (tmp_path / "config.yaml").write_text("post_hooks: []\n")  # no formatter run: the output is only inspected
    done = subprocess.run(
        [
            generator,
            "generate",
            "--path",
            "openapi.json",
            "--meta",
            "none",
            "--config",
            "config.yaml",
            "--output-path",
            "sdk",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "Warning" not in out and "WARNING" not in out and "will not be generated" not in out, out
    generated = {p.stem for p in (tmp_path / "sdk" / "api").rglob("*.py") if p.stem != "__init__"}
    assert generated == {op["operationId"] for _, _, op in _operations(schema)}
    models = {p.stem for p in (tmp_path / "sdk" / "models").glob("*.py")}
    assert {"attention_request", "attention_response", "softmax_request", "problem", "inference_request"} <= models


def test_docs_pages_load_their_assets_from_the_server() -> None:
    with TestClient(create_app(Settings(enable_onnx=False))) as http:
        for page in ("/docs", "/redoc"):
            r = http.get(page)
            assert r.status_code == 200 and "text/html" in r.headers["content-type"]
            assert "cdn" not in r.text.lower() and "googleapis" not in r.text
            assert "default-src 'none'" in r.headers["content-security-policy"]
            for asset in re.findall(r'(?:src|href)="([^"]+)"', r.text):
                assert asset.startswith(DOCS_ASSETS), asset
                got = http.get(asset)
                assert got.status_code == 200 and len(got.content) > 1000, asset
        assert "swagger-ui-bundle.js" in http.get("/docs").text and "redoc.standalone.js" in http.get("/redoc").text
        assert http.get("/docs/oauth2-redirect").status_code == 200
