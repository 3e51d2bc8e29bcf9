"""Benchmark of ``attention_diagnostics`` on small inputs: the list path against what the service runs.

For float32 causal softmax weights with their scores (masked = -inf) and an output, it times, in one run and
interleaved, the list path on its own (``small_diagnostics``, the pure-Python twin, with ``valid_keys`` already
broadcast and clipped as ``attention_diagnostics`` does first) and ``attention_diagnostics`` itself, which takes
the list path up to its threshold (weights + 16 x rows <= 384) and the numpy path above it, and prints the
medians and their ratio. Below the threshold the ratio is the cost of the checks before the path (a few us);
above it, what the numpy path costs over the list path on the same input.

The numpy path cannot be timed on its own below the threshold: the service has no public name for it (the
benchmark used to lower a private constant of ``service.core.diagnostics.report``; bench/README.md says which
hook it needs).

    python -m bench diagnostics [--rounds 15] [--calls 200]
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import numpy as np

from bench.suite import Parser
from service.core.diagnostics.report import attention_diagnostics
from service.core.diagnostics.small import small_diagnostics
from service.core.diagnostics.thresholds import DiagnosticThresholds

SHAPES = [(1, 1, 4, 4), (1, 2, 8, 8), (1, 4, 8, 8), (1, 2, 16, 16), (1, 4, 16, 16), (1, 8, 16, 16), (1, 8, 32, 32)]
ROW_WORK, SMALL_WORK = 16, 384
"""The threshold as ``service/core/diagnostics/report.py`` states it: the list path when weights + 16 x rows <= 384."""


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


def arguments() -> Parser:
    parser = Parser(__name__, __doc__, quick={"rounds": 1, "calls": 5})
    parser.add_rounds(15)
    parser.add_argument("--calls", type=int, default=200, help="calls per round and path (default 200)")
    return parser


def main(argv: list[str]) -> int:
    args = arguments().parse(argv)
    thresholds = DiagnosticThresholds()
    print(
        "attention_diagnostics, float32 weights + scores + output, causal top_left; the list path when weights + "
        f"{ROW_WORK} x rows <= {SMALL_WORK}; median of {args.rounds} interleaved rounds of {args.calls} calls\n"
    )
    print("| shape (B, Hq, L, S) | weights | path taken | list path (us) | attention_diagnostics (us) | ratio |")
    print("|---|---:|---|---:|---:|---:|")
    for shape in SHAPES:
        w, valid, scores, output = inputs(shape)
        nv = np.minimum(np.maximum(valid, 0), shape[-1])  # as attention_diagnostics clips it

        def listed(w: np.ndarray = w, nv: np.ndarray = nv, s: np.ndarray = scores, o: np.ndarray = output) -> object:
            return small_diagnostics(w, nv, s, o, 0, thresholds)

        def default(
            w: np.ndarray = w, valid: np.ndarray = valid, s: np.ndarray = scores, o: np.ndarray = output
        ) -> object:
            return attention_diagnostics(w, valid, scores=s, output=o, causal="top_left")

        times: dict[str, list[float]] = {"list": [], "default": []}
        for _ in range(args.rounds):
            for path, call in (("list", listed), ("default", default)):
                call()
                times[path].append(per_call(call, args.calls))
        med = {k: statistics.median(v) * 1e6 for k, v in times.items()}
        taken = "list" if w.size + ROW_WORK * (w.size // shape[-1]) <= SMALL_WORK else "numpy"
        print(
            f"| {shape} | {w.size} | {taken} | {med['list']:.1f} | {med['default']:.1f} "
            f"| {med['default'] / med['list']:.2f} |"
        )
    return 0
