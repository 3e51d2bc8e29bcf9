"""The playground's page and assets as the server sends them (the browser tests are in test_page.py)."""

from __future__ import annotations

import re

from fastapi.testclient import TestClient

from service.app import create_app
from service.settings import Settings


def test_page_assets_and_policy() -> None:
    with TestClient(create_app(Settings(enable_onnx=False))) as http:
        page = http.get("/")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        csp = page.headers["content-security-policy"]
        assert csp.startswith("default-src 'none'") and "script-src 'self';" in csp and "unsafe" not in csp
        assert "<script>" not in page.text and " style=" not in page.text  # nothing inline: the policy allows none
        assets = re.findall(r'(?:src|href)="(playground/[^"]+)"', page.text)
        assert sorted(assets) == ["playground/playground.css", "playground/playground.js"]
        for asset in assets:
            got = http.get("/" + asset)
            assert got.status_code == 200 and len(got.content) > 1000
        assert "text/javascript" in http.get("/playground/playground.js").headers["content-type"]
        assert "/" not in http.get("/openapi.json").json()["paths"]  # a page, not an operation
