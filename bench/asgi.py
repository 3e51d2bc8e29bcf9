"""An app driven in process through ASGI, as a server would call it, without sockets: for the benchmarks that
time what the service does per request apart from the network (``middleware``, ``http``'s in-process columns).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

ASGIApp = Any
"""A Starlette or FastAPI app (called as ``await app(scope, receive, send)``)."""


def scope(method: str, path: str, body: bytes = b"", headers: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The HTTP scope of one request from 127.0.0.1 (``path`` may carry a query string)."""
    path, _, query = path.partition("?")
    raw = [(b"host", b"bench"), (b"user-agent", b"bench")]
    raw += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    if body and not any(k == b"content-length" for k, _ in raw):
        raw.append((b"content-length", str(len(body)).encode()))
    if body and not any(k == b"content-type" for k, _ in raw):
        raw.append((b"content-type", b"application/json"))
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": query.encode(),
        "headers": raw,
        "client": ("127.0.0.1", 5000),
        "server": ("127.0.0.1", 8000),
        "state": {},
    }


async def call(
    app: ASGIApp, method: str, path: str, body: bytes = b"", headers: Mapping[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    """One request: (status, headers with lower-case names, body)."""
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:  # the app waits for the client to go away once it has answered
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    status = 0
    out_headers: dict[str, str] = {}
    chunks: list[bytes] = []

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
            out_headers.update((k.decode().lower(), v.decode()) for k, v in message.get("headers", ()))
        elif message["type"] == "http.response.body":
            chunks.append(bytes(message.get("body", b"")))

    await app(scope(method, path, body, headers), receive, send)
    return status, out_headers, b"".join(chunks)
