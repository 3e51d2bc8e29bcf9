"""Backward against forward: how much a gradient costs, on each engine, measured in one run.

For a few shapes (float32 softmax by default, causal, S = L, four query heads per kv head pair as GQA does not
change the cost), times the forward pass (output and weights) and the backward pass (the gradients of
query, key and value) on the numpy engine as the service runs it (worker threads, BLAS one thread per
call) and on the ONNX engine (the fused forward graph, the softmax backward graph), and prints the
medians and the backward/forward ratio. The ratio is the figure to read: the two passes alternate,
so both see the same machine.

    python -m bench backward [--repeats 7] [--normalizer relu]

An engine without a backward pass for the normalizer (ONNX has one for softmax only) is left out.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable

import numpy as np

from bench.suite import Parser
from service.core.backward import BackwardTask
from service.core.types import AttentionInputs, AttentionParams, AttentionTask
from service.engines.numpy_engine import NumpyEngine
from service.engines.onnx_engine import OnnxEngine
from service.export import DEFAULT_MODELS_DIR

SHAPES = [(1, 8, 128, 64), (2, 12, 256, 64), (4, 12, 512, 64)]


def paired_medians(a: Callable[[], object], b: Callable[[], object], repeats: int) -> tuple[float, float]:
    """Median seconds of ``a`` and of ``b``, called alternately (so a busy neighbour slows both alike)."""
    a(), b()
    ta, tb = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        a()
        t1 = time.perf_counter()
        b()
        t2 = time.perf_counter()
        ta.append(t1 - t0)
        tb.append(t2 - t1)
    return statistics.median(ta), statistics.median(tb)


def arguments() -> Parser:
    parser = Parser(__name__, __doc__, quick={"repeats": 1})
    parser.add_repeats(7)
    parser.add_argument("--normalizer", default="softmax", choices=("softmax", "sparsemax", "entmax15", "relu"))
    return parser


def main(argv: list[str]) -> int:
    args = arguments().parse(argv)
    numpy_engine = NumpyEngine()
    numpy_engine.start()
    onnx_engine = OnnxEngine(DEFAULT_MODELS_DIR)
    onnx_engine.start()
    assert onnx_engine.ready, onnx_engine.describe()
    print(f"numpy engine threads {numpy_engine.threads}; ONNX on {onnx_engine.provider}")
    print()
    print(f"normalizer {args.normalizer}, float32\n")
    print("| shape (B, H, L, E), S = L | engine | forward ms | backward ms | backward / forward |")
    print("|---|---|---:|---:|---:|")
    for B, H, L, E in SHAPES:
        rng = np.random.default_rng(0)
        q, k, v, g = (rng.standard_normal((B, H, L, E), dtype=np.float32) for _ in range(4))
        task = AttentionTask(
            AttentionInputs(q, k, v),
            AttentionParams(normalizer=args.normalizer, causal="top_left"),
            np.dtype(np.float32),
            need_weights=True,
        )
        backward = BackwardTask(task, g)
        for name, engine in (("numpy", numpy_engine), ("onnx", onnx_engine)):
            if engine.backward_unsupported_reason(backward) is not None:
                continue
            forward_s, backward_s = paired_medians(
                lambda e=engine, t=task: e.run(t), lambda e=engine, b=backward: e.run_backward(b), args.repeats
            )
            print(
                f"| ({B}, {H}, {L}, {E}) | {name} | {forward_s * 1e3:.2f} | {backward_s * 1e3:.2f} | "
                f"{backward_s / forward_s:.2f} |"
            )
    print(f"\nload average after: {os.getloadavg()[0]:.2f}")
    numpy_engine.close()
    return 0
