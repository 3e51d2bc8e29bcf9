"""The Python client end to end: identity vs gzip answers on one (1, 8, 128, 64) attention request.

httpx asks for gzip by default; the client sends ``Accept-Encoding: identity`` unless
``compression=True``. This starts a server (ONNX off), times both settings interleaved in one
run, and prints the medians and their ratio.

    .venv/bin/python bench/bench_client.py [--rounds 40]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from attention_client import AttentionClient

from tests.live import serve


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=40)
    args = parser.parse_args()
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


if __name__ == "__main__":
    main()
