"""Security parts of the edge: security headers, and CORS answering in the service's error format.

API keys are checked by :class:`service.dataplane.auth.ApiKeys` (both front ends use it).
"""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.types import Receive, Scope, Send

from service.http.error_responses import app_path, error_response

DOCS_PATHS = frozenset({"/docs", "/docs/oauth2-redirect", "/redoc"})
"""Swagger UI and ReDoc pages load scripts and styles, so they get no Content-Security-Policy."""

PAGE_PATHS = frozenset({"/", "/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json"})
PAGE_PREFIXES = ("/playground/", "/docs/assets/")
"""The pages that hold no data (the playground and its assets, the API's description and its viewers): public by
default when API keys are set (``ATTN_PAGES_PUBLIC``). Only static mounts serve paths under the prefixes."""


def is_page(method: str, path: str) -> bool:
    """Whether a request reads one of the pages (a GET or HEAD of :data:`PAGE_PATHS` or under :data:`PAGE_PREFIXES`)."""
    return method in ("GET", "HEAD") and (path in PAGE_PATHS or path.startswith(PAGE_PREFIXES))


SECURITY_HEADERS = (
    ("x-content-type-options", "nosniff"),
    ("x-frame-options", "DENY"),
    ("referrer-policy", "no-referrer"),
    ("cache-control", "no-store"),
)
API_CSP = ("content-security-policy", "default-src 'none'; frame-ancestors 'none'")


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
