"""The HTTP floor for bench/bench_http.py: a bare FastAPI endpoint that returns a constant (POST reads the body first),
and ``POST /bare/sized?n=N`` that answers N bytes (the transport of a large request and answer alone).

Served exactly as the service is (uvicorn with uvloop and httptools, one worker,
no server header), so the difference between the two is what the service does
per request beyond HTTP and routing.

    python bench/http_bare_app.py --port 8001
"""

from __future__ import annotations

import argparse

from fastapi import FastAPI, Request
from starlette.responses import Response

app = FastAPI()
CONSTANT = b'{"ok":true}'


@app.post("/bare")
async def bare(request: Request) -> Response:
    await request.body()
    return Response(CONSTANT, media_type="application/json")


_SIZED: dict[int, bytes] = {}


@app.post("/bare/sized")
async def bare_sized(request: Request, n: int) -> Response:
    """Reads the body and answers ``n`` bytes: the transport floor of a request and answer of these sizes."""
    await request.body()
    body = _SIZED.get(n)
    if body is None:
        body = _SIZED[n] = b"1" * n
    return Response(body, media_type="application/json")


@app.get("/bare")
async def bare_get() -> Response:
    return Response(CONSTANT, media_type="application/json")


if __name__ == "__main__":
    import uvicorn

    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--log-level", default="warning")
    args = parser.parse_args()
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        server_header=False,
        loop="uvloop",
        http="httptools",
    )
