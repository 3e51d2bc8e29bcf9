"""Per-request cost of the middleware, in-process: the app driven through ASGI with and without it.

    python -m bench middleware [--n 20000]

Builds two apps as ``create_app`` does (settings from ``ATTN_*``, ONNX off) and
calls them directly (no server, no sockets) for ``GET /healthz`` and a tiny
``POST /v1/attention``: the service's app, and a second one whose list of user
middleware (Starlette's ``user_middleware``, from which it builds its stack on
its first request) keeps only the gzip layer (routing, handlers and Starlette's
own error layers stay). The difference of the best batches is what the
middleware costs each request. Logging is at warning, so the access line is
built but not written (as in the HTTP benchmarks).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import orjson

from bench.asgi import scope
from bench.suite import Parser
from service.app import create_app
from service.http.responses import GZipIfAccepted
from service.settings import Settings

TINY = orjson.dumps(
    {"query": [[1.0, 0.0], [0.0, 1.0]], "key": [[1.0, 0.0], [0.0, 1.0]], "value": [[1.0, 2.0], [3.0, 4.0]]}
)


async def timed(apps: list[Any], method: str, path: str, body: bytes, n: int) -> list[float]:
    """Microseconds of one request for each app (its fastest batch), over ``n`` each, in interleaved batches of 100
    (so that the load of a shared machine falls on both alike).
    """

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    status = 0

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    batches: list[list[float]] = [[] for _ in apps]
    for _ in range(n // 100):
        for app, times in zip(apps, batches, strict=True):
            t0 = time.perf_counter()
            for _ in range(100):
                await app(scope(method, path, body), receive, send)
            times.append((time.perf_counter() - t0) / 100 * 1e6)
            assert status == 200, status
    return [min(times) for times in batches]  # the least disturbed batch: robust on a shared machine


def arguments() -> Parser:
    parser = Parser(__name__, __doc__, quick={"n": 200})
    parser.add_argument("--n", type=int, default=20000, help="requests per app and case, in batches of 100")
    return parser


def main(argv: list[str]) -> int:
    args = arguments().parse(argv)
    logging.getLogger("service").setLevel(logging.WARNING)
    settings = Settings(enable_onnx=False)
    full = create_app(settings)
    full.state.runtime.start_engines()
    bare = create_app(settings)  # an app of its own, configured before its first request builds its stack
    bare.state.runtime.start_engines()
    gzip: object = GZipIfAccepted
    bare.user_middleware = [m for m in bare.user_middleware if m.cls is gzip]

    async def run() -> None:
        cases = (("GET /healthz", "GET", "/healthz", b""), ("POST /v1/attention (tiny)", "POST", "/v1/attention", TINY))
        for name, method, path, body in cases:
            await timed([full, bare], method, path, body, min(2000, args.n))  # warm-up (route templates, caches)
            with_mw, without = await timed([full, bare], method, path, body, args.n)
            print(f"{name}: {with_mw:.1f} us with the middleware, {without:.1f} us without: {with_mw - without:.1f} us")

    asyncio.run(run())
    return 0
