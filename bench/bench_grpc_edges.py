"""The memory figures of issue 27, item 3: large messages over both protocols against the memory budget.

    python -m bench grpc-edges mixed [--clients 32] [--mb 30]     # REST and gRPC uploads at once, keyed
    python -m bench grpc-edges unauthenticated [--clients 64] [--mb 30]
    python -m bench grpc-edges burst [--clients 24] [--mb 30]         # a 256 MiB budget, messages refused once read
    python -m bench grpc-edges all

Each command starts
``python -m service serve`` with gRPC on (numpy only; the defaults: a 1 GiB memory budget,
32 MiB bodies) and an API key, warms it up, and prints JSON lines: the idle RSS (VmRSS, MiB) after warm-up, the
peak (VmHWM) against the budget plus 400 MiB, the idle RSS 6 s after the burst, and the answers by status.

- ``mixed``: ``--clients`` REST /v2 attention uploads of ``--mb`` MB (binary) and as many gRPC ``ModelInfer``
  calls of the same size (raw), all at once, all with the key (the issue measured 1,908 MiB at the peak).
- ``unauthenticated``: ``--clients`` gRPC calls of ``--mb`` MB without a key (the issue: 1,038 MiB left idle).
- ``burst``: ``--clients`` keyed gRPC calls of ``--mb`` MB at once to a server with a 256 MiB budget, each refused
  once read (an input name the model does not have), so that it measures the reading: the burst of
  ``tests/grpc/test_hostile.py::test_messages_are_read_inside_the_memory_budget``, whose bound is this peak limit.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from argparse import Namespace
from collections import Counter
from typing import Any

import grpc
import httpx
import numpy as np
from grpc import aio

from bench.bench_edges import MB, Server, binary_infer, post_many, shape_for
from bench.ports import free_port
from bench.suite import Parser
from service.grpc.generated import inference_pb2 as pb
from service.grpc.generated import inference_pb2_grpc as pb_grpc

KEY = "bench-grpc-edges-key-0123456789"
BUDGET_MIB = 1024
SLACK_MIB = 400


def emit(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def grpc_request(shape: tuple[int, ...]) -> pb.ModelInferRequest:
    """An attention call with raw float32 query, key and value of ``shape``, output only, no diagnostics."""
    request = pb.ModelInferRequest(model_name="attention")
    rng = np.random.default_rng(0)
    for name in ("query", "key", "value"):
        request.inputs.add(name=name, datatype="FP32", shape=list(shape))
        request.raw_input_contents.append(rng.standard_normal(shape).astype("<f4").tobytes())
    request.outputs.add(name="output")
    request.parameters["diagnostics"].bool_param = False
    return request


async def infer_many(target: str, request: pb.ModelInferRequest, n: int, key: str) -> Counter[str]:
    """``n`` concurrent calls over 8 connections; their status names."""
    options = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
    channels = [
        aio.insecure_channel(target, options=[*options, ("grpc.use_local_subchannel_pool", 1)]) for _ in range(8)
    ]
    metadata = (("x-api-key", key),) if key else None

    async def one(i: int) -> str:
        try:
            await pb_grpc.GRPCInferenceServiceStub(channels[i % 8]).ModelInfer(request, metadata=metadata, timeout=300)
        except aio.AioRpcError as err:
            return err.code().name
        return "OK"

    try:
        return Counter(await asyncio.gather(*(one(i) for i in range(n))))
    finally:
        for channel in channels:
            await channel.close()


def started(**env: str) -> tuple[Server, str]:
    grpc_port = free_port()
    server = Server({"ATTN_GRPC_ENABLED": "true", "ATTN_GRPC_PORT": str(grpc_port), "ATTN_API_KEYS": KEY, **env})
    return server, f"127.0.0.1:{grpc_port}"


def warm(server: Server, target: str) -> float:
    """A small call on each protocol, then the idle RSS once quiet."""
    body, headers = binary_infer((1, 1, 4, 4))
    httpx.post(server.url + "/v2/models/attention/infer", content=body, headers={**headers, "x-api-key": KEY})
    with grpc.insecure_channel(target) as channel:
        pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(grpc_request((1, 1, 4, 4)), metadata=(("x-api-key", KEY),))
    time.sleep(2)
    return server.rss_mb()


def report(command: str, server: Server, idle: float, budget_mib: int = BUDGET_MIB, **answers: Any) -> None:
    peak = server.rss_mb("VmHWM")
    time.sleep(6)
    emit(
        command=command,
        idle_rss_mib=round(idle),
        peak_rss_mib=round(peak),
        peak_limit_mib=budget_mib + SLACK_MIB,
        idle_after_6s_mib=round(server.rss_mb()),
        idle_growth_mib=round(server.rss_mb() - idle),
        **answers,
    )
    server.stop()


def mixed(args: Namespace) -> None:
    server, target = started()
    idle = warm(server, target)
    body, headers = binary_infer(shape_for(args.mb, 1024))
    request = grpc_request(shape_for(args.mb, 1024))

    async def both() -> tuple[Counter[str], Counter[str]]:
        rest = post_many(server.url + "/v2/models/attention/infer", body, {**headers, "x-api-key": KEY}, args.clients)
        calls = infer_many(target, request, args.clients, KEY)
        return await asyncio.gather(rest, calls)

    rest, calls = asyncio.run(both())
    report("mixed", server, idle, mb=round(len(body) / MB, 1), rest=dict(rest), grpc=dict(calls))


def unauthenticated(args: Namespace) -> None:
    server, target = started()
    idle = warm(server, target)
    request = grpc_request(shape_for(args.mb, 1024))
    calls = asyncio.run(infer_many(target, request, args.clients, ""))
    report("unauthenticated", server, idle, mb=round(request.ByteSize() / MB, 1), grpc=dict(calls))


BURST_BUDGET_MIB = 256


def burst(args: Namespace) -> None:
    budget = str(BURST_BUDGET_MIB << 20)
    server, target = started(ATTN_MEMORY_BUDGET_BYTES=budget, ATTN_MAX_BODY_BYTES=str(32 << 20))
    idle = warm(server, target)
    shape = (max(1, int(args.mb * MB / 4 / 16384)), 16384)  # one float32 tensor of about --mb MB
    request = pb.ModelInferRequest(model_name="softmax")
    request.inputs.add(name="nope", datatype="FP32", shape=list(shape))
    request.raw_input_contents.append(np.zeros(shape, dtype="<f4").tobytes())
    calls = asyncio.run(infer_many(target, request, args.clients, KEY))
    report("burst", server, idle, BURST_BUDGET_MIB, mb=round(request.ByteSize() / MB, 1), grpc=dict(calls))


COMMANDS = {"mixed": (mixed, 32), "unauthenticated": (unauthenticated, 64), "burst": (burst, 24)}


def arguments() -> Parser:
    parser = Parser(__name__, __doc__, quick={"clients": 2, "mb": 1.0})
    parser.add_argument("command", choices=[*COMMANDS, "all"])
    parser.add_clients(
        None, "calls (and, with mixed, as many uploads) at once (default 32 mixed, 64 unauthenticated, 24 burst)"
    )
    parser.add_argument("--mb", type=float, default=30.0, help="MB per message (default 30)")
    return parser


def main(argv: list[str]) -> int:
    args = arguments().parse(argv)
    given = args.clients
    for name in COMMANDS if args.command == "all" else [args.command]:
        fn, clients = COMMANDS[name]
        args.clients = clients if given is None else given
        fn(args)
    emit(command="load-after", load=[round(x, 2) for x in os.getloadavg()])
    return 0
