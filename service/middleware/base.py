"""Small helpers shared by the pure ASGI middleware."""

from __future__ import annotations

from collections.abc import Iterable

from starlette.types import Receive, Scope, Send

from service.api.errors import app_path, error_response

OPERATIONAL_PATHS = frozenset({"/healthz", "/readyz", "/metrics", "/v2/health/live", "/v2/health/ready"})
"""Probes and scrapes: never queued or refused for load, so they answer while the service is saturated."""


def header(scope: Scope, name: bytes) -> str | None:
    """The first value of a request header (``name`` in lower case), decoded as latin-1."""
    headers: Iterable[tuple[bytes, bytes]] = scope.get("headers", ())
    for key, value in headers:
        if key == name:
            return value.decode("latin-1")
    return None


async def send_error(
    scope: Scope, receive: Receive, send: Send, status: int, detail: str, headers: dict[str, str] | None = None
) -> None:
    """Answer with the error body of the path's protocol (problem+json, or ``{"error"}`` under /v2)."""
    await error_response(app_path(scope), status, detail, headers=headers)(scope, receive, send)
