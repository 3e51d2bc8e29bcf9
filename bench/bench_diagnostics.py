"""Benchmark of ``attention_diagnostics`` on small inputs: the list path against the numpy path.

For float32 causal softmax weights with their scores (masked = -inf) and an output, it times, in one
run and interleaved, the same call with each path forced (``diagnostics._SMALL_WORK`` set above
or below the input's size) and with the default switch, and prints the medians and the ratio
numpy / list (above 1: the list path is faster). The shapes straddle the threshold, so the table
shows where the list path stops winning.

Usage: ``python bench/bench_diagnostics.py [--rounds 15] [--calls 200]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from service.core.diagnostics import report as diagnostics  # noqa: E402

SHAPES = [(1, 1, 4, 4), (1, 2, 8, 8), (1, 4, 8, 8), (1, 2, 16, 16), (1, 4, 16, 16), (1, 8, 16, 16), (1, 8, 32, 32)]


def inputs(shape: tuple[int, int, int, int]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Causal (top_left) float32 softmax weights, their scores, valid keys and an output (Dv = 8)."""
    rng = np.random.default_rng(0)
    _, _, rows, keys = shape
    scores = rng.standard_normal(shape, dtype=np.float32) * 2
    keep = np.arange(keys)[None, :] <= np.arange(rows)[:, None]
    scores = np.where(keep, scores, np.float32(-np.inf))
    e = np.exp(scores - scores.max(-1, keepdims=True))
    weights = (e / e.sum(-1, keepdims=True)).astype(np.float32)
    valid = np.broadcast_to(keep.sum(-1), shape[:3]).astype(np.int64)
    output = rng.standard_normal((*shape[:3], 8), dtype=np.float32)
    return weights, valid, scores, output


def per_call(fn: Callable[[], object], calls: int) -> float:
    """Seconds per call of ``calls`` calls in a row."""
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15, help="interleaved rounds (the median is reported)")
    parser.add_argument("--calls", type=int, default=200, help="calls per round and path")
    args = parser.parse_args()
    default = diagnostics._SMALL_WORK
    rule = f"weights + {diagnostics._ROW_WORK} * rows <= {default}"
    print(f"attention_diagnostics, float32 weights + scores + output, causal top_left; list path when {rule}")
    print(f"median of {args.rounds} interleaved rounds of {args.calls} calls\n")
    print("| shape (B, Hq, L, S) | weights | list path (us) | numpy path (us) | numpy / list | default (us) |")
    print("|---|---:|---:|---:|---:|---:|")
    for shape in SHAPES:
        w, valid, scores, output = inputs(shape)

        def call(
            w: np.ndarray = w, valid: np.ndarray = valid, s: np.ndarray = scores, o: np.ndarray = output
        ) -> object:
            return diagnostics.attention_diagnostics(w, valid, scores=s, output=o, causal="top_left")

        times: dict[str, list[float]] = {"list": [], "numpy": [], "default": []}
        limits = {"list": 1 << 30, "numpy": 0, "default": default}
        try:
            for _ in range(args.rounds):
                for path, limit in limits.items():
                    diagnostics._SMALL_WORK = limit
                    call()
                    times[path].append(per_call(call, args.calls))
        finally:
            diagnostics._SMALL_WORK = default
        med = {k: statistics.median(v) * 1e6 for k, v in times.items()}
        print(
            f"| {shape} | {w.size} | {med['list']:.1f} | {med['numpy']:.1f} | {med['numpy'] / med['list']:.2f} "
            f"| {med['default']:.1f} |"
        )


if __name__ == "__main__":
    main()
