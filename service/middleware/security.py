"""Security middleware: API keys, security headers, and CORS answering in the service's error format."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Collection, Sequence

from starlette.datastructures import Headers, MutableHeaders
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.errors import app_path, error_response
from service.middleware.base import header, send_error
from service.observability.metrics import ServiceMetrics

DOCS_PATHS = frozenset({"/docs", "/docs/oauth2-redirect", "/redoc"})
"""Swagger UI and ReDoc pages load scripts and styles, so they get no Content-Security-Policy."""

SECURITY_HEADERS = (
    ("x-content-type-options", "nosniff"),
    ("x-frame-options", "DENY"),
    ("referrer-policy", "no-referrer"),
    ("cache-control", "no-store"),
)
API_CSP = ("content-security-policy", "default-src 'none'; frame-ancestors 'none'")


class SecurityHeadersMiddleware:
    """Adds nosniff, frame denial, no referrer and ``Cache-Control: no-store`` to every response
    (unless the app set its own cache policy), and a deny-all Content-Security-Policy except on the
    interactive docs.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        extra = SECURITY_HEADERS if app_path(scope) in DOCS_PATHS else (*SECURITY_HEADERS, API_CSP)

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in extra:
                    headers.setdefault(name, value)
            await send(message)

        await self.app(scope, receive, send_with_headers)


class ApiKeys:
    """Checks a presented key against every configured key in constant time.

    Keys are compared as SHA-256 digests with :func:`hmac.compare_digest`, so
    neither a key's content nor its length shows in the timing, and every
    configured key is compared (no early exit on the first match).
    """

    def __init__(self, keys: Sequence[str]) -> None:
        self._digests = [hashlib.sha256(key.encode()).digest() for key in keys]

    def accepts(self, presented: str) -> bool:
        digest = hashlib.sha256(presented.encode()).digest()
        matched = False
        for known in self._digests:
            matched |= hmac.compare_digest(digest, known)
        return matched


def presented_key(scope: Scope) -> str | None:
    """The key the request presents, or None when it presents none.

    An ``Authorization`` header takes precedence: ``Bearer <key>`` presents the
    key, any other value presents an invalid one ("") rather than falling back
    to ``X-API-Key``, so a request never passes beside a credential that fails.
    """
    authorization = header(scope, b"authorization")
    if authorization is not None:
        scheme, _, credentials = authorization.strip().partition(" ")
        return credentials.strip() if scheme.lower() == "bearer" else ""
    key = header(scope, b"x-api-key")
    return key.strip() if key and key.strip() else None


class ApiKeyMiddleware:
    """401 (with ``WWW-Authenticate: Bearer``) unless the request carries a configured API key;
    ``exempt`` paths (probes, the metrics scrape) pass without one.
    """

    def __init__(self, app: ASGIApp, keys: Sequence[str], exempt: Collection[str], metrics: ServiceMetrics) -> None:
        self.app = app
        self.keys = ApiKeys(keys)
        self.exempt = frozenset(exempt)
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or app_path(scope) in self.exempt:
            await self.app(scope, receive, send)
            return
        key = presented_key(scope)
        if key is not None and self.keys.accepts(key):
            await self.app(scope, receive, send)
            return
        self.metrics.rejected.labels("unauthorized").inc()
        if key is None:
            detail = "this endpoint needs an API key: send 'Authorization: Bearer <key>' or 'X-API-Key: <key>'"
            challenge = 'Bearer realm="attention-service"'
        else:
            detail = "the API key is not valid"
            challenge = 'Bearer realm="attention-service", error="invalid_token"'
        await send_error(scope, receive, send, 401, detail, headers={"WWW-Authenticate": challenge})


class CorsMiddleware(CORSMiddleware):
    """Starlette's CORS, with refused preflights answered in the service's error format (not plain text)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "OPTIONS":
            headers = Headers(scope=scope)
            if "origin" in headers and "access-control-request-method" in headers:
                response = self.preflight_response(request_headers=headers)
                if response.status_code >= 400:
                    kept = {k: v for k, v in response.headers.items() if k not in ("content-length", "content-type")}
                    response = error_response(
                        app_path(scope), response.status_code, bytes(response.body).decode(), headers=kept
                    )
                await response(scope, receive, send)
                return
        await super().__call__(scope, receive, send)
