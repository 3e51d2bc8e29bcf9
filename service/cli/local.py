"""``--local``: the service's app in this process, called through ASGI directly (no server, no socket, and
no HTTP client: a plain install has everything it needs). The request is the one the client would send
and the answer the one a server would give, validation and messages included.
"""

from __future__ import annotations

import asyncio
import binascii
import json
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

import numpy as np

Message = MutableMapping[str, Any]
READY_TIMEOUT_S = 120.0
"""How long to wait for the engines to warm up (ONNX sessions take a few seconds)."""


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None


async def asgi_request(
    app: Callable[[Message, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]], Awaitable[None]],
    method: str,
    path: str,
    body: bytes = b"",
) -> Answer:
    """One HTTP request to an ASGI app, in this process."""
    headers = [(b"host", b"local"), (b"accept", b"application/json"), (b"user-agent", b"attention-service-cli")]
    if body:
        headers += [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    scope: Message = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 0),
        "server": ("local", 80),
        "state": {},
    }
    delivered = False
    finished = asyncio.Event()
    status = 0
    response_headers: dict[str, str] = {}
    chunks: list[bytes] = []

    async def receive() -> Message:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await finished.wait()  # the client stays connected until the answer is complete
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = int(message["status"])
            response_headers.update({k.decode("latin-1").lower(): v.decode("latin-1") for k, v in message["headers"]})
        elif message["type"] == "http.response.body":
            chunks.append(bytes(message.get("body", b"")))
            if not message.get("more_body", False):
                finished.set()

    await app(scope, receive, send)
    finished.set()
    return Answer(status, response_headers, b"".join(chunks))


def encode_body(fields: dict[str, Any]) -> bytes:
    """A request body: arrays in the ``b64`` wire form (little-endian C order), None left out."""
    body = {name: wire(value) if isinstance(value, np.ndarray) else value for name, value in fields.items()}
    return json.dumps({k: v for k, v in body.items() if v is not None}, allow_nan=False).encode()


def wire(array: np.ndarray[Any, Any]) -> dict[str, Any]:
    """The ``b64`` wire form: float16/32/64 and bool keep their dtype, anything else goes as float64."""
    if array.dtype == np.bool_:
        name = "bool"
    elif array.dtype.kind == "f" and array.dtype.itemsize in (2, 4, 8):
        name = f"float{8 * array.dtype.itemsize}"
    else:
        array, name = array.astype(np.float64), "float64"
    if array.dtype != np.bool_:
        array = array.astype(array.dtype.newbyteorder("<"), copy=False)
    data = np.ascontiguousarray(array).tobytes()
    return {"shape": list(array.shape), "dtype": name, "b64": binascii.b2a_base64(data, newline=False).decode()}


def call(path: str, fields: dict[str, Any], *, onnx: bool) -> Answer:
    """POST ``fields`` to ``path`` of an app built in this process (ONNX on when ``onnx``), once it is ready."""
    from service.app import create_app
    from service.settings import Settings

    # No API keys (nothing crosses a network) and no gRPC listener (it would take ATTN_GRPC_PORT from a server).
    app = create_app(Settings(enable_onnx=onnx, api_keys=None, grpc_enabled=False))
    body = encode_body(fields)

    async def run() -> Answer:
        async with app.router.lifespan_context(app):
            loop = asyncio.get_running_loop()
            deadline = loop.time() + READY_TIMEOUT_S
            while (await asgi_request(app, "GET", "/readyz")).status != 200 and loop.time() < deadline:
                await asyncio.sleep(0.02)
            return await asgi_request(app, "POST", path, body)

    return asyncio.run(run())
