"""The HTTP floor for ``python -m bench http``: a bare FastAPI endpoint that returns a constant (POST reads the body
first), ``POST /bare/sized?n=N`` that answers N bytes (the transport of a large request and answer alone), and
``POST /bare/attention``, the service's maths with none of its per-request layers (the numerics floor of a
tiny /v2 request).

Served exactly as the service is (uvicorn with uvloop and httptools, one worker,
no server header), so the difference between the two is what the service does
per request beyond HTTP and routing.

    python -m bench.http_bare_app --port 8001
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import orjson
from fastapi import FastAPI, Request
from starlette.responses import Response

from service.core.attention import run_attention
from service.core.diagnostics import attention_diagnostics
from service.core.types import AttentionInputs, AttentionParams, AttentionTask

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


def tiny_answer(body: bytes) -> bytes | None:
    """A /v2 JSON attention request (float32 query, key and value) answered with output, weights and diagnostics
    by the service's own numerics (``service.core``), without its parsing, validation, budgets, dispatch, metrics
    or middleware: what no implementation on this server and these functions goes below. None when a tensor is
    not finite. :mod:`bench.http_edge_floor` runs it inside the service's HTTP edge.
    """
    tensors = {
        t["name"]: np.array(t["data"], dtype=np.float32).reshape(t["shape"]) for t in orjson.loads(body)["inputs"]
    }
    if not all(np.isfinite(a).all() for a in tensors.values()):
        return None
    inputs = AttentionInputs(tensors["query"], tensors["key"], tensors["value"])
    # scores too, as the service computes them for the diagnostics' score statistics
    result = run_attention(AttentionTask(inputs, AttentionParams("softmax"), need_weights=True, need_scores=True))
    assert result.weights is not None
    diagnostics = attention_diagnostics(result.weights, result.valid_keys, scores=result.scores, output=result.output)
    answer = {
        "model_name": "attention",
        "parameters": {"diagnostics": orjson.dumps(diagnostics, option=orjson.OPT_SERIALIZE_NUMPY).decode()},
        "outputs": [
            {"name": name, "datatype": "FP32", "shape": list(a.shape), "data": a.reshape(-1)}
            for name, a in (("output", result.output), ("weights", result.weights))
        ],
    }
    return orjson.dumps(answer, option=orjson.OPT_SERIALIZE_NUMPY)


async def bare_attention(request: Request) -> Response:
    """:func:`tiny_answer` on a plain Starlette route, not FastAPI's."""
    answer = tiny_answer(await request.body())
    if answer is None:
        return Response(b'{"error":"not finite"}', status_code=400, media_type="application/json")
    return Response(answer, media_type="application/json")


app.add_route("/bare/attention", bare_attention, methods=["POST"])


@app.get("/bare")
async def bare_get() -> Response:
    return Response(CONSTANT, media_type="application/json")


def main(argv: list[str]) -> int:
    import uvicorn

    parser = argparse.ArgumentParser(prog="python -m bench.http_bare_app", description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--log-level", default="warning")
    args = parser.parse_args(argv)
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        server_header=False,
        loop="uvloop",
        http="httptools",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
