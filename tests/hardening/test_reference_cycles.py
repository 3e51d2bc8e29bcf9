"""Requests leave no reference cycles behind: each request's objects are freed when it ends, not by the collector.

A cycle per request (the middleware's exchange held the scope that held it, and
its own bound ``send``) left ~25 objects per request to the garbage collector:
a collection every ~30 requests, and garbage that lives until then. Driven
through ASGI in-process, with the collector off while the requests run; the
collection afterwards must find nothing unreachable.
"""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import orjson
import pytest

from service.app import create_app
from service.settings import Settings

TINY = [[1.0, 0.0], [0.0, 1.0]]
V1 = orjson.dumps({"query": TINY, "key": TINY, "value": TINY, "return": ["output", "weights", "diagnostics"]})
V2 = orjson.dumps(
    {
        "inputs": [
            {"name": n, "shape": [2, 2], "datatype": "FP32", "data": [1.0, 0.0, 0.0, 1.0]}
            for n in ("query", "key", "value")
        ]
    }
)
V2_BAD = orjson.dumps({"inputs": [{"name": "query", "shape": [1, 2], "datatype": "FP32", "data": [1, 2, 3]}]})
CASES: dict[str, tuple[str, str, bytes, dict[str, str], int]] = {
    "v1 attention": ("POST", "/v1/attention", V1, {}, 200),
    "v2 infer": ("POST", "/v2/models/attention/infer", V2, {}, 200),
    "v2 infer, bad input": ("POST", "/v2/models/attention/infer", V2_BAD, {}, 400),
    "v1 attention, bad body": ("POST", "/v1/attention", b'{"query": 1}', {}, 422),
    "body too large": ("POST", "/v1/attention", V1, {"content-length": str(1 << 40)}, 413),
    "healthz": ("GET", "/healthz", b"", {}, 200),
    "not found": ("GET", "/nowhere", b"", {}, 404),
    "metrics": ("GET", "/metrics", b"", {}, 200),
}


def scope(method: str, path: str, body: bytes, extra: dict[str, str]) -> dict[str, Any]:
    headers = {"host": "test", "content-type": "application/json"}
    if body:
        headers["content-length"] = str(len(body))
    headers.update(extra)
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(k.encode(), v.encode()) for k, v in headers.items()],
        "client": ("127.0.0.1", 5000),
        "server": ("127.0.0.1", 8000),
    }


async def request(app: Any, method: str, path: str, body: bytes, extra: dict[str, str]) -> int:
    messages = [{"type": "http.request", "body": body, "more_body": False}]
    status: list[int] = []

    async def receive() -> dict[str, Any]:
        return messages.pop() if messages else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            status.append(message["status"])

    await app(scope(method, path, body, extra), receive, send)
    return status[0]


@pytest.fixture(scope="module")
def app() -> Any:
    app = create_app(Settings(enable_onnx=False))
    app.state.runtime.start_engines()
    yield app
    app.state.runtime.close_engines()


@pytest.mark.parametrize("case", list(CASES))
def test_requests_leave_nothing_for_the_garbage_collector(app: Any, case: str) -> None:
    method, path, body, extra, expected = CASES[case]

    async def run() -> tuple[list[int], int]:
        statuses = [await request(app, method, path, body, extra) for _ in range(3)]  # warm caches
        gc.collect()
        gc.disable()
        try:
            statuses += [await request(app, method, path, body, extra) for _ in range(20)]
            return statuses, gc.collect()
        finally:
            gc.enable()

    statuses, unreachable = asyncio.run(run())
    assert set(statuses) == {expected}
    assert unreachable == 0
