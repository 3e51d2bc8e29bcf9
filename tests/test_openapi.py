"""The committed openapi.yaml is exactly what the app serves."""

from __future__ import annotations

from pathlib import Path

import yaml

from service.openapi import openapi_schema

ROOT = Path(__file__).resolve().parents[1]


def test_committed_openapi_matches_the_app() -> None:
    committed = yaml.safe_load((ROOT / "openapi.yaml").read_text())
    assert committed == openapi_schema(), "openapi.yaml is stale: run `python -m service openapi --out openapi.yaml`"


def test_openapi_documents_the_fixed_names() -> None:
    schema = openapi_schema()
    paths = schema["paths"]
    for path in ("/v1/attention", "/v1/softmax", "/healthz", "/readyz", "/v1/engines", "/v1/models"):
        assert path in paths, path
    request = schema["components"]["schemas"]["AttentionRequest"]["properties"]
    for name in (
        "query",
        "key",
        "value",
        "mask",
        "causal",
        "key_lengths",
        "scale",
        "temperature",
        "normalizer",
        "alpha",
        "engine",
        "precision",
        "return",
        "encoding",
    ):
        assert name in request, name
    assert paths["/v1/attention"]["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "AttentionRequest"
    )
