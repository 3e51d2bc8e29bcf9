"""Benchmark of the numpy engine, in-process (issue 2).

One run prints a Markdown table: for several shapes, output-only and with
weights, the engine's median time, its attention rate (4*B*H*L*S*E flop/s), the
same as a fraction of this machine's float32 matmul rate (numpy ``a @ a`` on
2048x2048, BLAS on every core), and the speed-up over a plain numpy baseline that materialises
every temporary (broadcast matmul, ``np.exp`` of the shifted scores, division)
the way a first version typically does.

A second table times tiny requests (issue 8): the engine's one-pass path for tasks of at most
``FAST_PATH_SCORES`` scores against the general chunked path forced on the same task (blocks of
calls of each, interleaved, so machine load affects both alike), weights and scores returned.

    python bench/bench_numpy_engine.py [--repeats 7]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from collections.abc import Callable
from functools import partial

import numpy as np
from timing import all_cores, matmul_rate, median_time

import service.core.attention.forward as core
from service.core.types import AttentionInputs, AttentionParams, AttentionTask
from service.engines.numpy_engine import NumpyEngine

SHAPES = [(1, 1, 4, 4), (1, 8, 128, 64), (2, 12, 256, 64), (4, 12, 512, 64)]
TINY_CASES = [
    ((1, 1, 4, 4), "softmax", None),
    ((1, 1, 4, 4), "softmax", "causal"),
    ((1, 1, 4, 4), "relu", None),
    ((1, 1, 4, 4), "sparsemax", None),
    ((1, 1, 4, 4), "entmax15", None),
    ((2, 4, 16, 16), "softmax", "mask"),
    ((1, 8, 64, 64), "softmax", None),
]
"""(B, H, L, E) with S = L, normalizer, and mask: None, ``causal`` (top_left) or ``mask`` (boolean, random)."""


def plain_numpy(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, need_weights: bool
) -> tuple[np.ndarray, np.ndarray | None]:
    """The baseline: straightforward softmax attention with full-size temporaries."""
    scores = (q @ np.swapaxes(k, -1, -2)) / np.sqrt(q.shape[-1])
    e = np.exp(scores - scores.max(axis=-1, keepdims=True))
    w = e / e.sum(axis=-1, keepdims=True)
    return w @ v, (w if need_weights else None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    engine = NumpyEngine()  # as the service runs it: a worker pool, BLAS one thread per call
    engine.start()
    peak = matmul_rate()
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, numpy {np.__version__}; "
        f"float32 matmul 2048^3: {peak / 1e9:.1f} GFLOP/s; engine threads: {engine.threads}; "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    print()
    print("| shape (B, H, L, E), S = L | weights | engine ms | GFLOP/s | % of matmul | plain numpy ms | speed-up |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for shape in SHAPES:
        B, H, L, E = shape
        q, k, v = (rng.standard_normal(shape, dtype=np.float32) for _ in range(3))
        flops = 4 * B * H * L * L * E
        for need_weights in (False, True):
            task = AttentionTask(AttentionInputs(q, k, v), AttentionParams(), np.dtype(np.float32), need_weights)
            ours = median_time(partial(engine.run, task), args.repeats)
            with all_cores():
                base = median_time(partial(plain_numpy, q, k, v, need_weights), args.repeats)
            print(
                f"| {shape} | {'yes' if need_weights else 'no'} | {ours * 1e3:.3f} | {flops / ours / 1e9:.1f} | "
                f"{100 * flops / ours / peak:.0f}% | {base * 1e3:.3f} | {base / ours:.2f}x |"
            )
    tiny_table(engine, rng, max(args.repeats, 15))


def per_call(fn: Callable[[], object], calls: int) -> float:
    """Seconds per call over a block of ``calls`` calls."""
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls


def tiny_table(engine: NumpyEngine, rng: np.random.Generator, blocks: int) -> None:
    """The one-pass path against the chunked path on tiny tasks, median of interleaved blocks of calls."""
    print()
    print("| tiny task (B, H, L, E), S = L | normalizer | mask | one-pass us | chunked us | speed-up |")
    print("|---|---|---|---:|---:|---:|")
    threshold = core.FAST_PATH_SCORES
    for shape, normalizer, mask_kind in TINY_CASES:
        B, H, L, _ = shape
        q, k, v = (rng.standard_normal(shape, dtype=np.float32) for _ in range(3))
        mask = rng.random((B, H, L, L)) > 0.3 if mask_kind == "mask" else None
        params = AttentionParams(normalizer=normalizer, causal="top_left" if mask_kind == "causal" else None)
        task = AttentionTask(AttentionInputs(q, k, v, mask), params, np.dtype(np.float32), True, True)
        calls = max(10, 20000 // (B * H * L * L))
        fast, general = [], []
        try:
            for _ in range(blocks):
                core.FAST_PATH_SCORES = threshold
                fast.append(per_call(partial(engine.run, task), calls))
                core.FAST_PATH_SCORES = -1
                general.append(per_call(partial(engine.run, task), calls))
        finally:
            core.FAST_PATH_SCORES = threshold
        f, g = statistics.median(fast), statistics.median(general)
        print(f"| {shape} | {normalizer} | {mask_kind or '-'} | {f * 1e6:.1f} | {g * 1e6:.1f} | {g / f:.2f}x |")


if __name__ == "__main__":
    main()
