"""Benchmark of the numpy engine, in-process (issue 2).

One run prints a Markdown table: for several shapes, output-only and with
weights, the engine's median time, its attention rate (4*B*H*L*S*E flop/s), the
same as a fraction of this machine's float32 matmul rate (numpy ``a @ a`` on
2048x2048, BLAS on every core), and the speed-up over a plain numpy baseline that materialises
every temporary (broadcast matmul, ``np.exp`` of the shifted scores, division)
the way a first version typically does.

    python bench/bench_numpy_engine.py [--repeats 7]
"""

from __future__ import annotations

import argparse
import os
import platform
from functools import partial

import numpy as np
from timing import all_cores, matmul_rate, median_time

from service.core.types import AttentionInputs, AttentionParams, AttentionTask
from service.engines.numpy_engine import NumpyEngine

SHAPES = [(1, 1, 4, 4), (1, 8, 128, 64), (2, 12, 256, 64), (4, 12, 512, 64)]


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


if __name__ == "__main__":
    main()
