"""The floor of a tiny /v2 JSON request in this service's HTTP edge, for ``python -m bench http``: the service's app
with a route of its own in front of /v2 inference, whose job is the bare app's maths.

Everything a request meets before and after its job is the service's own: the connection protocol, the
API-key check, admission, request ids, the body read, the scheduler and its memory lease, metrics and the
access log. The job itself is :func:`bench.http_bare_app.tiny_answer`: parse, ``service.core``'s attention and
diagnostics, orjson, with none of the job's checks, budgets, dispatch or timing. So, in one run:

- this server's p50 minus ``GET /healthz``'s is what a tiny request costs here with the job at its floor;
- the service's p50 minus this server's is what the job's own layers cost over the socket.

Nothing of the service is replaced: :func:`floor_app` builds the app with ``create_app`` and puts one route at
the head of its route table (Starlette's list, as ``create_app`` itself orders its routes), at the same path
template as the service's inference route, so it is matched first, with the same metrics label. The route does
what the service's routes do around their work: one call into the data plane's door (admission, the body read on
its memory lease through the edge's limits, scheduling, the end), with the bare maths as its operation (no
readiness check and no statistics: it is no model of the protocol). :func:`serve` runs the app as ``python -m
service serve`` runs the service with one worker (uvicorn with the service's connection protocol, log
configuration and time limits), following the service's code by hand: bench/README.md says which public hook
would replace it.

    python -m bench.http_edge_floor --port 8002

Started by ``python -m bench http`` on 127.0.0.1; every setting comes from the ``ATTN_*`` environment.
"""

from __future__ import annotations

import argparse
import sys

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response

from bench.http_bare_app import tiny_answer
from service.app import create_app
from service.dataplane.context import Context
from service.dataplane.door import Call
from service.dataplane.memory import MemoryLease
from service.dataplane.scheduling import Job
from service.dataplane.timing import Timing
from service.http.bodies import declared_length, read_body
from service.http.routing import RawRoute
from service.settings import Settings

INFER_PATH = "/v2/models/{model_name}/infer"
"""The service's /v2 inference route (``service/http/v2/routes.py``), which the floor's route goes in front of."""


class BareMaths:
    """The floor's operation and codec (the door's :class:`~service.dataplane.door.Operation` and
    :class:`~service.dataplane.door.Codec`): the bare app's maths on the body, estimated as free, so it runs on
    the event loop as a tiny request does; the body is the request and the answer's bytes the answer.
    """

    name = "bare"

    def decode(self, ctx: Context, operation: object, raw: bytes, caller: str) -> bytes:
        return raw

    def encode(self, operation: object, request: bytes, result: bytes) -> bytes:
        return result

    def prepare(self, ctx: Context, request: bytes, timing: Timing) -> Job[bytes]:
        def run(lease: MemoryLease) -> bytes:
            answer = tiny_answer(request)
            if answer is None:
                raise ValueError("a tensor is not finite")
            return answer

        return Job(0.0, 0, 0, run)


BARE = BareMaths()


def floor_app(settings: Settings) -> FastAPI:
    """The service's app, its /v2 inference answered by the bare maths (module docstring)."""
    app = create_app(settings)
    plane = app.state.plane
    max_bytes = plane.settings.max_body_bytes

    async def infer(request: Request, model_name: str) -> Response:
        async def read(lease: MemoryLease) -> bytes:
            return await read_body(request, max_bytes, json_only=False, lease=lease)

        call: Call[bytes, bytes, bytes, bytes] = Call(
            read=read, size=len, codec=BARE, operation=BARE, declared_bytes=declared_length(request)
        )
        return Response(await plane.door.serve(call), media_type="application/json")

    app.router.routes.insert(0, RawRoute(INFER_PATH, infer, methods=["POST"], include_in_schema=False))
    return app


def serve(settings: Settings, app: FastAPI) -> int:
    """Run ``app`` as ``python -m service serve`` runs the service with one worker, until SIGTERM or SIGINT."""
    import uvicorn

    from service.observability.logs import log_config

    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        log_config=log_config(settings.log_level, settings.log_format),
        access_log=False,  # the service writes its own access line per request
        server_header=False,
        # uvicorn annotates these int but hands them to asyncio.wait_for and loop.call_later, which take a float.
        timeout_graceful_shutdown=settings.shutdown_grace_s,  # type: ignore[arg-type]
        timeout_keep_alive=settings.keep_alive_timeout_s,  # type: ignore[arg-type]
        http="service.http.edge.protocol:BoundedHttpToolsProtocol",
    )
    server = uvicorn.Server(config)
    server.run()
    return 0 if server.started else 3


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.http_edge_floor", description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    settings = Settings(host="127.0.0.1", port=args.port)
    return serve(settings, floor_app(settings))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
