"""gRPC load driver (issue 27): many concurrent ModelInfer calls, valid and invalid mixed, tallied by kind.

    python -m bench.load_grpc --target 127.0.0.1:8001 [--clients 64] [--channels 8] [--duration 60] [--json out.json]

Started by ``python -m bench load`` (a process of its own, so that its clients do not share the load test's
interpreter); it prints no machine header, since its first line on stdout is the ``ready`` the load test waits for.

Runs ``--clients`` clients on grpc.aio, spread over ``--channels`` channels (each with its own subchannel
pool: distinct connections), each calling in a loop until ``--duration`` seconds have passed. Every call has
a 60 s deadline and ``x-request-id: <kind>-<n>`` metadata. Messages are serialized once, up front, and sent
as bytes (``unary_unary`` without a serializer); answers are not decoded.

Mix (weights): attention (1, 2, 16, 16) float32 raw (35), softmax (8, 64) raw (25); invalid: a wrong input
name (10), a shape that disagrees with the raw size (10), an unknown model (10), undecodable bytes (10).

Prints ``ready`` on stdout once every channel is connected (the clock starts then), and at the end a one-line
summary. The JSON (``--json``) holds the calls by status code and by kind, each kind's expected status (and
the answers that were neither it nor a busy refusal), the latency percentiles (all calls, and by kind), and
for RESOURCE_EXHAUSTED and UNAVAILABLE how many answers carried ``retry-after`` in their trailing metadata and
how many did not.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import random
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import numpy as np
from grpc import aio

from service.grpc.generated import inference_pb2 as pb

METHOD = "/inference.GRPCInferenceService/ModelInfer"
TIMEOUT_S = 60.0
BUSY = ("RESOURCE_EXHAUSTED", "UNAVAILABLE")
CHANNEL_OPTIONS = [
    ("grpc.use_local_subchannel_pool", 1),  # a connection of its own per channel
    ("grpc.max_receive_message_length", -1),
    ("grpc.max_send_message_length", -1),
]
WEIGHTS = {
    "valid_attention": 35,
    "valid_softmax": 25,
    "invalid_input_name": 10,
    "invalid_shape_size": 10,
    "unknown_model": 10,
    "undecodable": 10,
}
EXPECTED = {
    "valid_attention": "OK",
    "valid_softmax": "OK",
    "invalid_input_name": "INVALID_ARGUMENT",
    "invalid_shape_size": "INVALID_ARGUMENT",
    "unknown_model": "NOT_FOUND",
    "undecodable": "INVALID_ARGUMENT",
}
"""Each kind's answer when the server is not busy (busy: RESOURCE_EXHAUSTED or UNAVAILABLE with retry-after)."""


def softmax_request(shape: tuple[int, ...], name: str = "logits", raw_shape: tuple[int, ...] | None = None) -> bytes:
    """A serialized softmax call with raw float32 logits (``raw_shape``: the raw bytes' shape, if not ``shape``)."""
    request = pb.ModelInferRequest(model_name="softmax")
    request.inputs.add(name=name, datatype="FP32", shape=list(shape))
    rng = np.random.default_rng(1)
    request.raw_input_contents.append(rng.standard_normal(raw_shape or shape).astype("<f4").tobytes())
    return request.SerializeToString()


def attention_request(shape: tuple[int, ...], model: str = "attention") -> bytes:
    """A serialized attention call: query, key and value raw float32 of ``shape``."""
    request = pb.ModelInferRequest(model_name=model)
    rng = np.random.default_rng(0)
    for name in ("query", "key", "value"):
        request.inputs.add(name=name, datatype="FP32", shape=list(shape))
        request.raw_input_contents.append(rng.standard_normal(shape).astype("<f4").tobytes())
    return request.SerializeToString()


def build_messages() -> dict[str, bytes]:
    """Kind -> the bytes sent."""
    return {
        "valid_attention": attention_request((1, 2, 16, 16)),
        "valid_softmax": softmax_request((8, 64)),
        "invalid_input_name": softmax_request((8, 64), name="logitz"),
        "invalid_shape_size": softmax_request((8, 64), raw_shape=(8, 32)),
        "unknown_model": attention_request((1, 2, 16, 16), model="no-such-model"),
        "undecodable": b"\xff\xff\xff\xff\x0f not a protobuf message",
    }


class Tally:
    """What came back: codes by kind, latencies, retry-after on busy answers."""

    def __init__(self) -> None:
        self.by_kind: dict[str, Counter[str]] = defaultdict(Counter)
        self.latency_s: dict[str, list[float]] = defaultdict(list)
        self.retry_after: dict[str, Counter[str]] = {code: Counter() for code in BUSY}
        self.ids = itertools.count()

    def add(self, kind: str, code: str, seconds: float, trailers: dict[str, Any]) -> None:
        self.by_kind[kind][code] += 1
        self.latency_s[kind].append(seconds)
        if code in BUSY:
            self.retry_after[code]["with" if "retry-after" in trailers else "without"] += 1


async def client(channel: aio.Channel, messages: dict[str, bytes], tally: Tally, stop_at: float, seed: int) -> None:
    """Call until ``stop_at`` (monotonic), a kind at a time drawn by weight."""
    call = channel.unary_unary(METHOD, request_serializer=None, response_deserializer=None)
    rng = random.Random(seed)
    kinds, weights = list(WEIGHTS), list(WEIGHTS.values())
    while time.monotonic() < stop_at:
        kind = rng.choices(kinds, weights)[0]
        metadata = (("x-request-id", f"{kind}-{next(tally.ids)}"),)
        t0 = time.perf_counter()
        try:
            await call(messages[kind], timeout=TIMEOUT_S, metadata=metadata)
            code, trailers = "OK", {}
        except aio.AioRpcError as err:
            code, trailers = err.code().name, dict(err.trailing_metadata() or ())
        except Exception as exc:  # a client-side failure is tallied, not fatal
            code, trailers = f"CLIENT_ERROR:{type(exc).__name__}", {}
        tally.add(kind, code, time.perf_counter() - t0, trailers)


def percentiles(seconds: list[float]) -> dict[str, float]:
    """p50/p90/p99/max in ms (empty: all 0)."""
    if not seconds:
        return {"p50": 0.0, "p90": 0.0, "p99": 0.0, "max": 0.0}
    ordered = sorted(seconds)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e3, 2)

    return {"p50": at(0.50), "p90": at(0.90), "p99": at(0.99), "max": round(ordered[-1] * 1e3, 2)}


async def run(target: str, clients: int, channels: int, duration: float) -> dict[str, Any]:
    """Drive ``target`` for ``duration`` seconds; the report."""
    messages = build_messages()
    pool = [aio.insecure_channel(target, options=CHANNEL_OPTIONS) for _ in range(channels)]
    try:
        await asyncio.wait_for(asyncio.gather(*(ch.channel_ready() for ch in pool)), timeout=60)
        print("ready", flush=True)
        tally = Tally()
        start = time.monotonic()
        tasks = [client(pool[i % channels], messages, tally, start + duration, seed=i) for i in range(clients)]
        await asyncio.gather(*tasks)
        elapsed = time.monotonic() - start
    finally:
        await asyncio.gather(*(ch.close() for ch in pool))
    by_code: Counter[str] = Counter()
    for counts in tally.by_kind.values():
        by_code.update(counts)
    calls = sum(by_code.values())
    return {
        "target": target,
        "clients": clients,
        "channels": channels,
        "duration_s": round(elapsed, 2),
        "calls": calls,
        "calls_per_s": round(calls / elapsed, 1),
        "by_code": dict(sorted(by_code.items())),
        "by_kind": {k: dict(sorted(v.items())) for k, v in sorted(tally.by_kind.items())},
        "expected": EXPECTED,
        "not_as_expected": {  # neither the kind's expected status nor a busy refusal
            k: odd
            for k, v in sorted(tally.by_kind.items())
            if (odd := {c: n for c, n in v.items() if c != EXPECTED[k] and c not in BUSY})
        },
        "message_bytes": {k: len(v) for k, v in messages.items()},
        "latency_ms": percentiles([s for lat in tally.latency_s.values() for s in lat]),
        "latency_ms_by_kind": {k: percentiles(v) for k, v in sorted(tally.latency_s.items())},
        "retry_after": {code: {"with": c["with"], "without": c["without"]} for code, c in tally.retry_after.items()},
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.load_grpc", description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", required=True, help="host:port of the gRPC server")
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--channels", type=int, default=8)
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--json", help="write the report here")
    args = parser.parse_args(argv)
    report = asyncio.run(run(args.target, args.clients, max(1, min(args.channels, args.clients)), args.duration))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    print(f"gRPC: {report['calls']} calls in {report['duration_s']} s ({report['calls_per_s']}/s): {report['by_code']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
