"""The Python client end to end: identity vs gzip answers on one (1, 8, 128, 64) attention request.

httpx asks for gzip by default; the client sends ``Accept-Encoding: identity`` unless
``compression=True``. This starts a server (ONNX off), times both settings interleaved in one
run, and prints the medians and their ratio.

    python -m bench client [--rounds 40]

Needs the client (``attention-client``, installed by ``make test``); the server is started by the tests' own
helper (``tests/live.py``).
"""

from __future__ import annotations

import statistics
import time

import numpy as np
from attention_client import AttentionClient

from bench.suite import Parser
from tests.live import serve


def arguments() -> Parser:
    parser = Parser(__name__, __doc__, quick={"rounds": 2})
    parser.add_rounds(40, "interleaved rounds of one call with each setting")
    return parser


def main(argv: list[str]) -> int:
    args = arguments().parse(argv)
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 8, 128, 64), dtype=np.float32) for _ in range(3))
    with serve(ATTN_LOG_LEVEL="warning") as server:
        clients = {
            "identity (default)": AttentionClient(server.url),
            "gzip (compression=True)": AttentionClient(server.url, compression=True),
        }
        times: dict[str, list[float]] = {name: [] for name in clients}
        for client in clients.values():  # warm-up: connections, first-call costs
            client.attention(q, k, v)
        for _ in range(args.rounds):
            for name, client in clients.items():
                t0 = time.perf_counter()
                client.attention(q, k, v)
                times[name].append((time.perf_counter() - t0) * 1e3)
        for client in clients.values():
            client.close()
    medians = {name: statistics.median(t) for name, t in times.items()}
    print(f"attention (1, 8, 128, 64) float32, output + weights + diagnostics, {args.rounds} rounds interleaved")
    for name, ms in medians.items():
        print(f"  {name:<24} median {ms:7.2f} ms")
    identity, gzip = medians.values()
    print(f"  gzip / identity: {gzip / identity:.2f}x")
    return 0
