"""Decode steps of an attention session against the stateless request with the same prefix (issue 30).

    python -m bench sessions [--steps 200] [--caches 512,4096,16384] [--baseline-repeats 15]

Starts the service as production runs it (``python -m service serve``, one worker, REST and gRPC), with
``ATTN_MAX_BODY_BYTES`` raised to 160 MiB (and the memory budget to 2 GiB) so that the stateless baseline can send
16,384 positions of keys and values. For each cache size (12 heads, head size 64, float32) a sequence is filled
with its prefix, then stepped one new token at a time:

- **gRPC unary** (tritonclient.grpc, raw tensors), **/v2 binary** (tritonclient.http, binary tensor data) and
  **gRPC streaming** (one ``ModelStreamInfer`` stream, each step sent after the answer of the one before): step
  p50 and p99 and the request's bytes on the wire (the gRPC message, the HTTP body);
- **stateless /v2 binary**: ``attention`` with the whole prefix and ``causal: bottom_right``, the request a client
  without sessions sends for the same step (p50 of ``--baseline-repeats``);
- **in process**: the step's job alone (append, attention over the cache, diagnostics), against the time to read
  the cache once at this machine's memory bandwidth (``numpy``'s sum over 256 MiB, best of 5);
- **the floor**: a tiny stateless ``attention`` call ((1, 1, 4, 4), output only) over the same gRPC client and
  server, p50, plus the cache read: what no step over this wire goes below on this machine, and the stateless
  request's time over it, the largest speedup the machine allows. A target below the floor is printed as blocked
  by the machine.

Every step asks for output only (weights would be 4 bytes a position back), diagnostics off. Targets: gRPC unary
p50 at most 1.5 ms at 4,096 cached positions; at least 20x faster end to end than the stateless request at
4,096; at most 10 KB of request per step; the in-process step within 2x of reading the cache once.
"""

from __future__ import annotations

import asyncio
import os
import queue
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc as tg
import tritonclient.http as th

from bench.serving import service
from bench.suite import Parser

HEADS, HEAD_SIZE = 12, 64
CHUNK = 512
"""Positions per step while a prefix is filled."""
MAX_BODY = 160 << 20
TARGETS = {"grpc_p50_ms_at_4096": 1.5, "speedup_at_4096": 20.0, "request_bytes": 10_000, "in_process_ratio": 2.0}


def arguments() -> Parser:
    parser = Parser(__name__, __doc__, quick={"steps": 5, "caches": "512", "baseline_repeats": 2})
    parser.add_argument("--steps", type=int, default=200, help="decode steps per form and cache (default 200)")
    parser.add_argument("--caches", default="512,4096,16384", help="cache sizes, comma-separated")
    parser.add_argument("--baseline-repeats", type=int, default=15, help="stateless requests per cache (default 15)")
    return parser


def token(rng: np.random.Generator, positions: int = 1) -> dict[str, np.ndarray]:
    return {
        "query": rng.standard_normal((1, HEADS, 1, HEAD_SIZE), dtype=np.float32),
        "key": rng.standard_normal((1, HEADS, positions, HEAD_SIZE), dtype=np.float32),
        "value": rng.standard_normal((1, HEADS, positions, HEAD_SIZE), dtype=np.float32),
    }


def grpc_inputs(arrays: dict[str, np.ndarray]) -> list[tg.InferInput]:
    inputs = []
    for name, arr in arrays.items():
        tensor = tg.InferInput(name, list(arr.shape), "FP32")
        tensor.set_data_from_numpy(arr)
        inputs.append(tensor)
    return inputs


def http_inputs(arrays: dict[str, np.ndarray]) -> list[th.InferInput]:
    inputs = []
    for name, arr in arrays.items():
        tensor = th.InferInput(name, list(arr.shape), "FP32")
        tensor.set_data_from_numpy(arr, binary_data=True)
        inputs.append(tensor)
    return inputs


def grpc_bytes(arrays: dict[str, np.ndarray], sequence_id: str, start: bool) -> int:
    """The ``ModelInferRequest``'s size as tritonclient sends it (raw contents, the sequence parameters)."""
    from tritonclient.grpc import service_pb2

    request = service_pb2.ModelInferRequest(model_name="attention_session")
    for name, arr in arrays.items():
        request.inputs.add(name=name, datatype="FP32", shape=list(arr.shape))
        request.raw_input_contents.append(arr.tobytes())
    request.outputs.add(name="output")
    request.parameters["sequence_id"].string_param = sequence_id
    request.parameters["sequence_start"].bool_param = start
    request.parameters["sequence_end"].bool_param = False
    request.parameters["diagnostics"].bool_param = False
    return request.ByteSize()


def percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered) * 1e3, ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] * 1e3


def fill(client: tg.InferenceServerClient, sequence_id: str, cache: int, rng: np.random.Generator) -> None:
    """Start ``sequence_id`` and fill its cache to ``cache`` positions, ``CHUNK`` at a time over gRPC."""
    filled = 0
    while filled < cache:
        n = min(CHUNK, cache - filled)
        client.infer(
            "attention_session",
            grpc_inputs(token(rng, n)),
            outputs=[tg.InferRequestedOutput("output")],
            sequence_id=sequence_id,
            sequence_start=filled == 0,
            parameters={"diagnostics": False},
        )
        filled += n


def timed(step: Callable[[], object], steps: int) -> list[float]:
    samples = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        samples.append(time.perf_counter() - t0)
    return samples


def measure_grpc(target: str, cache: int, steps: int) -> tuple[list[float], int]:
    rng = np.random.default_rng(cache)
    client = tg.InferenceServerClient(target)
    sid = f"bench-unary-{cache}"
    fill(client, sid, cache, rng)
    arrays = token(rng)
    inputs, outputs = grpc_inputs(arrays), [tg.InferRequestedOutput("output")]

    def step() -> None:
        client.infer("attention_session", inputs, outputs=outputs, sequence_id=sid, parameters={"diagnostics": False})

    step()
    samples = timed(step, steps)
    client.infer("attention_session", [], sequence_id=sid, sequence_end=True)
    return samples, grpc_bytes(arrays, sid, False)


def measure_stream(target: str, cache: int, steps: int) -> list[float]:
    rng = np.random.default_rng(cache + 1)
    client = tg.InferenceServerClient(target)
    sid = f"bench-stream-{cache}"
    fill(client, sid, cache, rng)
    answers: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put(error or result))
    inputs, outputs = grpc_inputs(token(rng)), [tg.InferRequestedOutput("output")]

    def step() -> None:
        client.async_stream_infer(
            "attention_session", inputs, outputs=outputs, sequence_id=sid, parameters={"diagnostics": False}
        )
        answer = answers.get(timeout=30)
        if isinstance(answer, Exception):
            raise SystemExit(f"stream step failed: {answer}")

    step()
    try:
        return timed(step, steps)
    finally:
        client.stop_stream()
        client.infer("attention_session", [], sequence_id=sid, sequence_end=True)
        client.close()


def measure_rest(target: str, cache: int, steps: int) -> tuple[list[float], int]:
    rng = np.random.default_rng(cache + 2)
    fill(tg.InferenceServerClient(target.split("|")[1]), f"bench-rest-{cache}", cache, rng)
    client = th.InferenceServerClient(target.split("|")[0])
    sid = f"bench-rest-{cache}"
    arrays = token(rng)
    inputs, outputs = http_inputs(arrays), [th.InferRequestedOutput("output", binary_data=True)]

    def step() -> None:
        client.infer("attention_session", inputs, outputs=outputs, sequence_id=sid, parameters={"diagnostics": False})

    step()
    samples = timed(step, steps)
    body, _ = th.InferenceServerClient.generate_request_body(
        inputs, outputs=outputs, sequence_id=sid, parameters={"diagnostics": False}
    )
    return samples, len(body)


def measure_tiny(target: str, calls: int) -> list[float]:
    """A tiny stateless ``attention`` call over gRPC (tritonclient.grpc, raw tensors): the wire's own floor."""
    client = tg.InferenceServerClient(target)
    inputs = grpc_inputs({n: np.ones((1, 1, 4, 4), dtype=np.float32) for n in ("query", "key", "value")})
    outputs = [tg.InferRequestedOutput("output")]

    def call() -> None:
        client.infer("attention", inputs, outputs=outputs, parameters={"diagnostics": False})

    try:
        call()
        return timed(call, calls)
    finally:
        client.close()


def measure_stateless(rest: str, cache: int, repeats: int) -> list[float]:
    rng = np.random.default_rng(cache + 3)
    arrays = token(rng, cache)
    client = th.InferenceServerClient(rest, connection_timeout=120, network_timeout=120)
    inputs, outputs = http_inputs(arrays), [th.InferRequestedOutput("output", binary_data=True)]

    def step() -> None:
        client.infer("attention", inputs, outputs=outputs, parameters={"causal": "bottom_right", "diagnostics": False})

    step()
    return timed(step, repeats)


def memory_bandwidth() -> float:
    """Bytes per second numpy reads (the sum of 256 MiB of float32, best of 5)."""
    data = np.ones(64 << 20, dtype=np.float32)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        data.sum()
        best = min(best, time.perf_counter() - t0)
    return data.nbytes / best


async def in_process(caches: list[int], steps: int) -> dict[int, float]:
    """The step's job alone (no wire), p50 seconds per cache size."""
    from service.app import create_app
    from service.dataplane.options import SessionOptions
    from service.dataplane.sessions.step import SessionStep, prepare_step
    from service.dataplane.timing import Timing
    from service.settings import Settings

    app = create_app(
        Settings(
            enable_onnx=False,
            grpc_enabled=False,
            log_level="warning",
            session_cache_bytes=1 << 30,
            memory_budget_bytes=2 << 30,
        )
    )
    plane = app.state.plane
    out: dict[int, float] = {}
    async with app.router.lifespan_context(app):
        while plane.runtime.not_ready_reason() is not None:
            await asyncio.sleep(0.05)
        ctx = plane.context
        rng = np.random.default_rng(5)

        def run(sid: str, arrays: dict[str, np.ndarray], start: bool) -> None:
            step = SessionStep(
                "",
                sid,
                start,
                False,
                arrays["query"],
                arrays["key"],
                arrays["value"],
                None,
                SessionOptions(),
                "float32",
                False,
                False,
                "binary",
            )
            with plane.memory.lease() as lease:
                prepare_step(ctx, step, Timing()).run(lease)

        for cache in caches:
            sid = f"in-process-{cache}"
            filled = 0
            while filled < cache:
                n = min(CHUNK, cache - filled)
                run(sid, token(rng, n), filled == 0)
                filled += n
            arrays = token(rng)
            run(sid, arrays, False)
            out[cache] = statistics.median(timed(lambda sid=sid, arrays=arrays: run(sid, arrays, False), steps))
    return out


def verdict(met: bool, below_floor: bool, floor_ms: float) -> str:
    """``met``, or ``missed``, and whether the floor (a tiny call plus the cache read) already misses the target."""
    if met:
        return "met"
    if below_floor:
        return f"missed; blocked by this machine (the floor, {floor_ms:.2f} ms, misses it already)"
    return f"missed (the floor, {floor_ms:.2f} ms, would meet it)"


def main(argv: list[str]) -> int:
    args = arguments().parse(argv)
    caches = [int(c) for c in args.caches.split(",")]
    bandwidth = memory_bandwidth()
    local = asyncio.run(in_process(caches, args.steps))
    env = {
        "ATTN_MAX_BODY_BYTES": str(MAX_BODY),
        "ATTN_MEMORY_BUDGET_BYTES": str(2 << 30),
        "ATTN_SESSION_CACHE_BYTES": str(1 << 30),
        "ATTN_MAX_WORK_FLOPS": "1e12",
    }
    rows = []
    with tempfile.TemporaryDirectory() as tmp, service(Path(tmp) / "service.log", env) as served:
        rest, grpc_target = served.rest, served.grpc
        tiny50, _ = percentiles(measure_tiny(grpc_target, args.steps))
        for cache in caches:
            unary, unary_bytes = measure_grpc(grpc_target, cache, args.steps)
            rest_samples, rest_bytes = measure_rest(f"{rest}|{grpc_target}", cache, args.steps)
            stream = measure_stream(grpc_target, cache, args.steps)
            baseline = measure_stateless(rest, cache, args.baseline_repeats)
            rows.append((cache, unary, unary_bytes, rest_samples, rest_bytes, stream, baseline))
    print(
        f"12 heads, head size 64, float32, one new token per step; {args.steps} steps per form and cache; "
        f"memory bandwidth {bandwidth / 1e9:.1f} GB/s (numpy sum); a tiny stateless gRPC call: p50 {tiny50:.2f} ms\n"
    )
    print(
        "| cached positions | gRPC unary p50 / p99 (ms) | /v2 binary p50 / p99 (ms) | gRPC stream p50 / p99 (ms) "
        "| stateless /v2 binary p50 (ms) | stateless / gRPC unary | request bytes (gRPC, REST) "
        "| in process (ms) | cache read at bandwidth (ms) | floor: tiny call + cache read (ms) | stateless / floor |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    verdicts = []
    for cache, unary, unary_bytes, rest_samples, rest_bytes, stream, baseline in rows:
        (u50, u99), (r50, r99), (s50, s99) = percentiles(unary), percentiles(rest_samples), percentiles(stream)
        b50 = statistics.median(baseline) * 1e3
        read_ms = cache * HEADS * HEAD_SIZE * 2 * 4 / bandwidth * 1e3
        step_ms = local[cache] * 1e3
        floor = tiny50 + read_ms
        print(
            f"| {cache} | {u50:.2f} / {u99:.2f} | {r50:.2f} / {r99:.2f} | {s50:.2f} / {s99:.2f} | {b50:.1f} "
            f"| {b50 / u50:.1f}x | {unary_bytes}, {rest_bytes} | {step_ms:.3f} | {read_ms:.3f} | {floor:.2f} "
            f"| {b50 / floor:.1f}x |"
        )
        if cache == 4096:
            verdicts += [
                f"gRPC unary p50 at 4096: {u50:.2f} ms (target <= {TARGETS['grpc_p50_ms_at_4096']}): "
                + verdict(u50 <= TARGETS["grpc_p50_ms_at_4096"], floor > TARGETS["grpc_p50_ms_at_4096"], floor),
                f"stateless / session at 4096: {b50 / u50:.1f}x (target >= {TARGETS['speedup_at_4096']:g}x): "
                + verdict(b50 / u50 >= TARGETS["speedup_at_4096"], b50 / floor < TARGETS["speedup_at_4096"], floor),
            ]
        verdicts.append(
            f"request bytes at {cache}: {max(unary_bytes, rest_bytes)} (target <= {TARGETS['request_bytes']}): "
            + ("met" if max(unary_bytes, rest_bytes) <= TARGETS["request_bytes"] else "missed")
        )
        verdicts.append(
            f"in-process step at {cache}: {step_ms / read_ms:.1f}x the cache read (target <= "
            f"{TARGETS['in_process_ratio']:g}x): "
            + ("met" if step_ms / read_ms <= TARGETS["in_process_ratio"] else "missed")
        )
    print()
    for line in verdicts:
        print(f"- {line}")
    print(f"\nload average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0
