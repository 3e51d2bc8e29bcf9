"""The service with its /v2 inference job replaced by the bare app's maths: the floor of a tiny /v2 JSON request
in this service's HTTP edge, for bench/bench_http.py.

Everything a request meets before and after its job is the service's own: the connection protocol, the
API-key check, admission, request ids, the body read, the scheduler and its memory lease, metrics and the
access log. The job itself is :func:`http_bare_app.tiny_answer`: parse, ``service.core``'s attention and
diagnostics, orjson, with none of the job's checks, budgets, dispatch or timing. So, in one run:

- this server's p50 minus ``GET /healthz``'s is what a tiny request costs here with the job at its floor;
- the service's p50 minus this server's is what the job's own layers cost over the socket.

Started as the service is (``python -m service serve``'s code, one worker) on 127.0.0.1 and ``--port``; every
other setting comes from the ``ATTN_*`` environment.

    python bench/http_edge_floor.py --port 8002
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the service, when run as a script
sys.path.insert(0, str(Path(__file__).resolve().parent))  # http_bare_app

from http_bare_app import tiny_answer

import service.http.v2.routes as v2_routes
from service.dataplane.context import Context
from service.dataplane.memory import MemoryLease
from service.dataplane.models import Model
from service.dataplane.scheduling import Job


def floor_job(ctx: Context, model: Model, body: bytes, header_length: str | None) -> Job[v2_routes.Encoded]:
    """The /v2 job at its floor: the bare app's answer, estimated as free (so it runs on the event loop)."""

    def run(lease: MemoryLease) -> v2_routes.Encoded:
        answer = tiny_answer(body)
        if answer is None:
            raise ValueError("a tensor is not finite")
        return answer, {}, "application/json"

    return Job(0.0, 0, 0, run)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    v2_routes.infer_job = floor_job  # looked up by name when a request runs
    from service.__main__ import main as serve

    return serve(["serve", "--host", "127.0.0.1", "--port", str(args.port)])


if __name__ == "__main__":
    sys.exit(main())
