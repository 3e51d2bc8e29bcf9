"""API keys, CORS, security headers and the refusal of unsafe settings."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urljoin

import pytest
from pydantic import ValidationError

from service.dataplane.auth import ApiKeys
from service.settings import Settings
from tests.hardening.conftest import SOFTMAX, BrokenEngine, client_for, metric_value
from tests.http.conftest import assert_problem
from tests.playground.test_route import MODULE_IMPORT

KEY_A = "a" * 8 + "-test-key-0001"
KEY_B = "b" * 8 + "-test-key-0002"


@pytest.fixture(scope="module")
def keyed():  # type: ignore[no-untyped-def]
    with client_for(api_keys=[KEY_A, KEY_B]) as c:
        yield c


def test_missing_key_is_401_with_a_bearer_challenge(keyed) -> None:  # type: ignore[no-untyped-def]
    r = keyed.post("/v1/softmax", json=SOFTMAX)
    assert_problem(r, 401, detail="API key")
    assert r.headers["www-authenticate"].startswith("Bearer")


@pytest.mark.parametrize(
    "headers",
    [
        {"authorization": "Bearer wrong-key-but-long-enough"},
        {"x-api-key": KEY_A + "x"},
        {"authorization": f"Basic {KEY_A}"},
        {"x-api-key": KEY_A[:-1]},
        {"authorization": "Bearer", "x-api-key": KEY_A},
        {"authorization": "garbage", "x-api-key": KEY_A},
    ],
    ids=[
        "wrong-bearer",
        "longer",
        "basic-scheme",
        "prefix",
        "empty-bearer-beside-a-good-key",
        "bad-authorization-beside-a-good-key",
    ],
)
def test_wrong_key_is_401(keyed, headers: dict) -> None:  # type: ignore[no-untyped-def]
    r = keyed.post("/v1/softmax", json=SOFTMAX, headers=headers)
    assert_problem(r, 401)
    assert r.headers["www-authenticate"].startswith("Bearer")


@pytest.mark.parametrize(
    "headers",
    [{"authorization": f"Bearer {KEY_A}"}, {"authorization": f"bearer {KEY_B}"}, {"x-api-key": KEY_B}],
    ids=["bearer", "bearer-lowercase-second-key", "x-api-key"],
)
def test_a_configured_key_is_accepted(keyed, headers: dict) -> None:  # type: ignore[no-untyped-def]
    assert keyed.post("/v1/softmax", json=SOFTMAX, headers=headers).status_code == 200


def test_probes_and_metrics_are_exempt_but_the_rest_is_not(keyed) -> None:  # type: ignore[no-untyped-def]
    for path in ("/healthz", "/readyz", "/metrics"):
        assert keyed.get(path).status_code == 200, path
    for path in ("/v1/engines", "/v1/models", "/v2/models/attention/ready"):
        assert keyed.get(path).status_code == 401, path
    assert metric_value(keyed.get("/metrics").text, "attn_http_requests_rejected_total", reason="unauthorized") >= 3


PAGE_ASSET = re.compile(r'(?:src|href)="([^"#:]+\.(?:js|css|png))"')


def page_assets(c, path: str) -> set[str]:  # type: ignore[no-untyped-def]
    """The scripts, styles and icons a page loads (paths as the browser resolves them from ``path``), and the modules
    its scripts import (the playground's panels are ES modules).
    """
    found, todo = set(), [urljoin(path, asset) for asset in PAGE_ASSET.findall(c.get(path).text)]
    while todo:
        asset = todo.pop()
        if asset not in found:
            found.add(asset)
            if asset.endswith(".js") and asset.startswith("/playground/"):
                todo.extend(urljoin(asset, module) for module in MODULE_IMPORT.findall(c.get(asset).text))
    return found


def test_pages_are_public_with_keys_and_everything_they_load(keyed) -> None:  # type: ignore[no-untyped-def]
    """The playground, /docs, /redoc and the schema load without a key, with every asset they ask for."""
    pages = ["/", "/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json"]
    assets = set().union(*(page_assets(keyed, page) for page in ("/", "/docs", "/redoc")))
    assert {"/playground/playground.js", "/playground/playground.css", "/docs/assets/swagger-ui-bundle.js"} <= assets
    assert {"/playground/common.js", "/playground/decode.js", "/playground/rollout.js"} <= assets  # its modules
    for path in [*pages, *sorted(assets)]:
        r = keyed.get(path)
        assert r.status_code == 200 and r.content, path
    assert "/v1/attention" in keyed.get("/openapi.json").json()["paths"]


def test_the_api_stays_keyed_beside_public_pages(keyed) -> None:  # type: ignore[no-untyped-def]
    """Only reads of the pages are public: writes to their paths, the API and unknown paths need the key."""
    assert keyed.post("/", json={}).status_code == 401
    assert keyed.post("/openapi.json", json={}).status_code == 401
    assert keyed.get("/docsx").status_code == 401 and keyed.get("/playgroundx.js").status_code == 401
    assert keyed.get("/playground/missing.js").status_code == 404  # a static mount: no data behind it
    assert keyed.post("/v1/softmax", json=SOFTMAX).status_code == 401
    assert keyed.post("/v1/softmax", json=SOFTMAX, headers={"x-api-key": KEY_A}).status_code == 200


async def raw_get(app: Any, path: str, state: dict[str, Any]) -> tuple[int, bytes]:
    """GET ``path`` exactly as given (no client normalises it), straight into the ASGI app."""
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"testserver")],
        "client": ("127.0.0.1", 50000),
        "server": ("testserver", 80),
        "state": dict(state),
    }
    await app(scope, receive, send)
    return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:])


@pytest.mark.parametrize(
    "path", ["/playground/../v1/models", "/docs/assets/../../v1/engines", "/playground/./../openapi.json/../v1/models"]
)
def test_a_dot_segment_under_a_page_prefix_reaches_no_api(keyed, path: str) -> None:  # type: ignore[no-untyped-def]
    """A raw ``/playground/../v1/models`` (clients normalise it; a hostile one need not) stays the static mount's."""
    status, body = keyed.portal.call(raw_get, keyed.app, path, keyed.app_state)
    assert status == 404 and b"numpy" not in body, (status, body[:200])


def test_pages_are_private_on_request() -> None:
    """``ATTN_PAGES_PUBLIC=false``: every page needs the key, as the API does."""
    with client_for(api_keys=[KEY_A], pages_public=False) as c:
        for path in ("/", "/docs", "/redoc", "/openapi.json", "/playground/playground.js", "/docs/assets/favicon.png"):
            assert c.get(path).status_code == 401, path
            assert c.get(path, headers={"authorization": f"Bearer {KEY_A}"}).status_code == 200, path


def test_401_on_v2_keeps_the_protocol_error_body(keyed) -> None:  # type: ignore[no-untyped-def]
    r = keyed.get("/v2/models/attention")
    assert r.status_code == 401 and set(r.json()) == {"error"} and r.headers["www-authenticate"].startswith("Bearer")


def test_exempt_paths_are_a_setting() -> None:
    with client_for(api_keys=[KEY_A], auth_exempt_paths=["/healthz"]) as c:
        assert c.get("/healthz").status_code == 200
        assert c.get("/metrics").status_code == 401


def test_schema_documents_the_keys_when_configured(keyed) -> None:  # type: ignore[no-untyped-def]
    schema = keyed.get("/openapi.json", headers={"x-api-key": KEY_A}).json()
    assert set(schema["components"]["securitySchemes"]) == {"bearer", "apiKey"}
    assert "401" in schema["paths"]["/v1/attention"]["post"]["responses"]
    assert "401" not in schema["paths"]["/healthz"]["get"]["responses"]


def test_key_check_compares_every_key_by_digest() -> None:
    keys = ApiKeys([KEY_A, KEY_B])
    assert keys.accepts(KEY_A) and keys.accepts(KEY_B)
    assert not keys.accepts("") and not keys.accepts(KEY_A.upper()) and not keys.accepts(KEY_A + KEY_B)


# -- unsafe settings -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"ATTN_API_KEYS": ""}, "holds no key"),
        ({"ATTN_API_KEYS": f"{KEY_A},"}, "key #2 has 0 characters"),
        ({"ATTN_API_KEYS": f"{KEY_A},short-key"}, "key #2 has 9 characters"),
        ({"ATTN_CORS_ALLOW_ORIGINS": "*", "ATTN_CORS_ALLOW_CREDENTIALS": "true"}, "any site"),
        ({"ATTN_CORS_ALLOW_ORIGINS": "https://ok.example.com/path"}, "is not an origin"),
        ({"ATTN_WORKERS": "2"}, "ATTN_METRICS_DIR"),
        ({"ATTN_QUEUE_TIMEOUT_S": "5", "ATTN_REQUEST_TIMEOUT_S": "5"}, "shorter than"),
        ({"ATTN_AUTH_EXEMPT_PATHS": "/healthz,metrics"}, "'metrics' is not a path"),
        ({"ATTN_MAX_BODY_BYTES": str(64 << 20), "ATTN_MEMORY_BUDGET_BYTES": str(32 << 20)}, "must not exceed"),
    ],
    ids=[
        "empty-keys",
        "empty-key",
        "short-key",
        "cors-star-credentials",
        "cors-path",
        "workers-no-metrics-dir",
        "queue-timeout",
        "exempt-path",
        "body-over-memory-budget",
    ],
)
def test_unsafe_settings_are_refused(monkeypatch: pytest.MonkeyPatch, env: dict, message: str) -> None:
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValidationError) as exc:
        Settings()
    text = str(exc.value)
    assert "unsafe settings" in text and message in text
    assert KEY_A not in text  # a refused setting never echoes a key


def test_keys_come_as_a_list_or_comma_separated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ATTN_API_KEYS", f" {KEY_A} , {KEY_B} ")
    assert [k.get_secret_value() for k in Settings().api_keys or []] == [KEY_A, KEY_B]
    monkeypatch.setenv("ATTN_API_KEYS", f'["{KEY_A}"]')
    assert [k.get_secret_value() for k in Settings().api_keys or []] == [KEY_A]
    assert KEY_A not in repr(Settings())


# -- CORS ----------------------------------------------------------------------------------------------------------

ORIGIN = "https://app.example.com"


def test_no_cors_headers_by_default() -> None:
    with client_for() as c:
        r = c.post("/v1/softmax", json=SOFTMAX, headers={"origin": ORIGIN})
        assert r.status_code == 200 and "access-control-allow-origin" not in r.headers
        pre = c.options("/v1/softmax", headers={"origin": ORIGIN, "access-control-request-method": "POST"})
        assert "access-control-allow-origin" not in pre.headers


def test_cors_allow_list() -> None:
    with client_for(cors_allow_origins=[ORIGIN], api_keys=[KEY_A]) as c:
        pre = c.options(
            "/v1/softmax",
            headers={
                "origin": ORIGIN,
                "access-control-request-method": "POST",
                "access-control-request-headers": "content-type, x-api-key",
            },
        )
        assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == ORIGIN  # no key needed
        r = c.post("/v1/softmax", json=SOFTMAX, headers={"origin": ORIGIN, "x-api-key": KEY_A})
        assert r.headers["access-control-allow-origin"] == ORIGIN
        assert "x-request-id" in r.headers["access-control-expose-headers"].lower()
        denied = c.post("/v1/softmax", json=SOFTMAX, headers={"origin": ORIGIN})
        assert (
            denied.status_code == 401 and denied.headers["access-control-allow-origin"] == ORIGIN
        )  # readable by the page
        bad = c.options(
            "/v1/softmax", headers={"origin": "https://evil.example.com", "access-control-request-method": "POST"}
        )
        assert_problem(bad, 400, detail="origin")
        assert "access-control-allow-origin" not in bad.headers
        other = c.post("/v1/softmax", json=SOFTMAX, headers={"origin": "https://evil.example.com", "x-api-key": KEY_A})
        assert "access-control-allow-origin" not in other.headers


# -- security headers ----------------------------------------------------------------------------------------------


def test_security_headers_on_every_answer() -> None:
    with client_for(BrokenEngine()) as c:
        answers = {
            "200": c.get("/healthz"),
            "404": c.get("/nope"),
            "422": c.post("/v1/softmax", json={}),
            "500": c.post("/v1/attention", json={"query": [[1.0]], "key": [[1.0]], "value": [[1.0]]}),
        }
        for status, r in answers.items():
            assert r.status_code == int(status)
            assert r.headers["x-content-type-options"] == "nosniff", status
            assert r.headers["x-frame-options"] == "DENY", status
            assert r.headers["referrer-policy"] == "no-referrer", status
            assert r.headers["cache-control"] == "no-store", status
            assert r.headers["content-security-policy"].startswith("default-src 'none'"), status
            assert "server" not in r.headers
        docs = c.get("/docs")
        assert docs.status_code == 200  # the docs' own policy: Swagger UI's scripts from this origin only
        assert "script-src 'self'" in docs.headers["content-security-policy"]
        assert docs.headers["x-frame-options"] == "DENY"
