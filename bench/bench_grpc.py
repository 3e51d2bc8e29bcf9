"""gRPC against REST /v2 binary, in one run, with tritonclient on both sides (issue 20's table).

    python -m bench grpc [--duration 5] [--clients 8]

Starts the service once the way production runs it (``python -m service serve``: uvicorn with REST and,
in the same process, gRPC; ATTN_LOG_LEVEL=warning, so no access line per request), then for each shape,
tiny (1, 1, 4, 4) and medium (1, 8, 128, 64), and each protocol:

- latency: p50 and p99 of sequential calls from one client (``tritonclient.grpc`` with raw tensors;
  ``tritonclient.http`` with the binary tensor data extension, inputs and outputs binary);
- throughput: answers per second with ``--clients`` threads, each with its own client.

Both send the same attention request (query, key, value FP32; outputs output and weights; diagnostics on,
as the service's default) and the answers are checked equal once. The client runs on the same machine as
the server: the ratios compare the two protocols under the same client overhead. Prints a Markdown table,
the ratios against the targets (medium gRPC p50 <= REST binary; tiny gRPC p50 <= 1.5x REST) and the load
average after.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc as tg
import tritonclient.http as th

from bench.serving import service
from bench.suite import Parser

TINY, MEDIUM = (1, 1, 4, 4), (1, 8, 128, 64)
OUTPUTS = ("output", "weights")


def tensors(shape: tuple[int, ...]) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {n: rng.standard_normal(shape).astype(np.float32) for n in ("query", "key", "value")}


def grpc_call(target: str, arrays: dict[str, np.ndarray]) -> Callable[[], dict[str, np.ndarray]]:
    client = tg.InferenceServerClient(target)
    inputs = []
    for name, arr in arrays.items():
        t = tg.InferInput(name, list(arr.shape), "FP32")
        t.set_data_from_numpy(arr)
        inputs.append(t)
    outputs = [tg.InferRequestedOutput(n) for n in OUTPUTS]

    def call() -> dict[str, np.ndarray]:
        result = client.infer("attention", inputs, outputs=outputs)
        return {n: result.as_numpy(n) for n in OUTPUTS}

    return call


def rest_call(url: str, arrays: dict[str, np.ndarray]) -> Callable[[], dict[str, np.ndarray]]:
    client = th.InferenceServerClient(url)
    inputs = []
    for name, arr in arrays.items():
        t = th.InferInput(name, list(arr.shape), "FP32")
        t.set_data_from_numpy(arr, binary_data=True)
        inputs.append(t)
    outputs = [th.InferRequestedOutput(n, binary_data=True) for n in OUTPUTS]

    def call() -> dict[str, np.ndarray]:
        result = client.infer("attention", inputs, outputs=outputs)
        return {n: result.as_numpy(n) for n in OUTPUTS}

    return call


def latency(call: Callable[[], Any], duration: float) -> tuple[float, float, int]:
    """(p50 ms, p99 ms, calls) of sequential calls for ``duration`` seconds, after a warm-up."""
    for _ in range(50):
        call()
    times = []
    end = time.perf_counter() + duration
    while time.perf_counter() < end or len(times) < 100:
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    times.sort()
    return statistics.median(times) * 1e3, times[int(0.99 * (len(times) - 1))] * 1e3, len(times)


def throughput(make: Callable[[], Callable[[], Any]], clients: int, duration: float) -> float:
    """Answers per second of ``clients`` threads calling for ``duration`` seconds, each with a client of its own
    made in its own thread (tritonclient.http's client runs on gevent: one thread each).
    """
    counts = [0] * clients
    start: list[float] = []
    ready = threading.Barrier(clients, action=lambda: start.append(time.perf_counter()))

    def run(i: int) -> None:
        call = make()
        call()
        ready.wait()  # every client made and warm: the clock starts
        stop = start[0] + duration
        while time.perf_counter() < stop:
            call()
            counts[i] += 1

    threads = [threading.Thread(target=run, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts) / (time.perf_counter() - start[0])


def arguments() -> Parser:
    parser = Parser(__name__, __doc__, quick={"duration": 0.2, "clients": 2})
    parser.add_duration(5.0)
    parser.add_clients(8, "threads of the throughput runs, a client each")
    return parser


def main(argv: list[str]) -> int:
    args = arguments().parse(argv)
    rows: dict[tuple[str, tuple[int, ...]], tuple[float, float, float]] = {}
    with tempfile.TemporaryDirectory() as tmp, service(Path(tmp) / "service.log") as served:
        url, target = served.rest, served.grpc
        for shape in (TINY, MEDIUM):
            arrays = tensors(shape)
            over_grpc, over_rest = grpc_call(target, arrays), rest_call(url, arrays)
            a, b = over_grpc(), over_rest()
            for name in OUTPUTS:
                np.testing.assert_array_equal(a[name], b[name])
            makers: tuple[tuple[str, Callable[[], Callable[[], Any]]], ...] = (
                ("gRPC raw", lambda arrays=arrays: grpc_call(target, arrays)),
                ("REST /v2 binary", lambda arrays=arrays: rest_call(url, arrays)),
            )
            for label, make in makers:
                p50, p99, _ = latency(make(), args.duration)
                rps = throughput(make, args.clients, args.duration)
                rows[(label, shape)] = (p50, p99, rps)
    load_after = os.getloadavg()[0]
    print(f"| request | protocol | p50 ms (1 client) | p99 ms | answers/s ({args.clients} clients) |")
    print("|---|---|---:|---:|---:|")
    for (label, shape), (p50, p99, rps) in rows.items():
        print(f"| {shape} | {label} | {p50:.3f} | {p99:.3f} | {rps:.0f} |")
    print()
    print("| target (p50, same run) | gRPC / REST | ratio | target | |")
    print("|---|---:|---:|---|---|")
    for name, shape, target in (("medium", MEDIUM, 1.0), ("tiny", TINY, 1.5)):
        g, r = rows[("gRPC raw", shape)][0], rows[("REST /v2 binary", shape)][0]
        verdict = "met" if g <= target * r else "MISSED"
        print(f"| {name} {shape} | {g:.3f} / {r:.3f} | **{g / r:.2f}x** | <= {target:g}x | {verdict} |")
    print()
    print(f"load average after: {load_after:.2f}; {args.duration:g} s per measurement; tritonclient on both sides")
    return 0
