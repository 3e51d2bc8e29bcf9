"""Benchmark: the numpy engine against the ONNX engine, in-process (issue 3).

One run prints a Markdown table: on (1, 8, 128, 64) and (4, 12, 512, 64)
(B, H, L, E with S = L), softmax, float32, output only and with weights, the
median time of each engine's ``run(task)`` after warm-up (everything an engine
does per request: mask building, casts, the session run, fix-ups), the
attention rate ``4*B*H*L*S*E / time`` as a percentage of this machine's float32
matmul rate (numpy ``a @ a`` on 2048x2048, the best of the medians measured
before, between and after the shapes, so that a busy moment does not lower the
reference), and the numpy/ONNX time ratio. The load average is printed: other
processes on the machine inflate every time in the table.

Targets (issue 3): the ONNX engine reaches >= 60% of the matmul rate on the
large shape, output only; the numpy engine is within 2x of the ONNX engine.

    python -m bench engines [--repeats 15] [--threads 0] [--scores]
"""

from __future__ import annotations

import os
from functools import partial

import numpy as np

from bench.suite import Parser
from bench.timing import matmul_rate, median_time
from service.core.types import AttentionInputs, AttentionParams, AttentionTask
from service.engines.numpy_engine import NumpyEngine
from service.engines.onnx_engine import OnnxEngine
from service.export import DEFAULT_MODELS_DIR

SHAPES = [(1, 8, 128, 64), (4, 12, 512, 64)]


def arguments() -> Parser:
    parser = Parser(__name__, __doc__, quick={"repeats": 1})
    parser.add_repeats(15)
    parser.add_argument("--threads", type=int, default=0, help="ONNX Runtime intra-op threads (0: its default)")
    parser.add_argument("--scores", action="store_true", help="also time weights + scores (the diagnostics path)")
    return parser


def main(argv: list[str]) -> int:
    args = arguments().parse(argv)
    reference = max(1, min(args.repeats, 7))  # the matmul rate's repeats

    onnx = OnnxEngine(DEFAULT_MODELS_DIR, intra_op_threads=args.threads)
    onnx.start()
    if not onnx.ready:
        raise SystemExit(f"ONNX engine not ready: {onnx.describe()['error']}")
    numpy_engine = NumpyEngine()  # as the service runs it: a worker pool, BLAS one thread per call
    numpy_engine.start()
    rates = [matmul_rate(repeats=reference)]
    rows = []
    rng = np.random.default_rng(0)
    variants = [("output", False, False), ("output + weights", True, False)]
    if args.scores:
        variants.append(("output + weights + scores", True, True))
    for shape in SHAPES:
        rates.append(matmul_rate(repeats=reference))
        B, H, L, E = shape
        q, k, v = (rng.standard_normal(shape, dtype=np.float32) for _ in range(3))
        flops = 4 * B * H * L * L * E
        for label, need_weights, need_scores in variants:
            task = AttentionTask(
                inputs=AttentionInputs(query=q, key=k, value=v),
                params=AttentionParams(),
                dtype=np.dtype(np.float32),
                need_weights=need_weights,
                need_scores=need_scores,
            )
            t_np = median_time(partial(numpy_engine.run, task), args.repeats)
            t_onnx = median_time(partial(onnx.run, task), args.repeats)
            rows.append((shape, label, t_np, t_onnx, onnx.graph_for(task), flops))
    rates.append(matmul_rate(repeats=reference))
    peak = max(rates)
    print(
        f"load average after: {os.getloadavg()[0]:.2f}; onnxruntime {onnx.describe()['onnxruntime_version']} on "
        f"{onnx.provider}; float32 matmul 2048^3: {peak / 1e9:.1f} GFLOP/s"
    )
    print()
    print(
        "| shape (B, H, L, E), S = L | returns | numpy ms | ONNX ms | ONNX graph | numpy % of matmul "
        "| ONNX % of matmul | numpy / ONNX |"
    )
    print("|---|---|---:|---:|---|---:|---:|---:|")
    for shape, label, t_np, t_onnx, graph, flops in rows:
        print(
            f"| {shape} | {label} | {t_np * 1e3:.2f} | {t_onnx * 1e3:.2f} | {graph} | "
            f"{100 * flops / t_np / peak:.0f}% | {100 * flops / t_onnx / peak:.0f}% | {t_np / t_onnx:.2f} |"
        )
    print()
    _, _, _, t_onnx, _, flops = next(r for r in rows if r[0] == SHAPES[-1] and r[1] == "output")
    share = flops / t_onnx / peak
    print(
        f"target 1: ONNX >= 60% of the matmul rate on {SHAPES[-1]}, output only: {100 * share:.0f}% "
        f"({'met' if share >= 0.6 else 'NOT met'})"
    )
    worst = max(r[2] / r[3] for r in rows)
    print(f"target 2: numpy within 2x of ONNX: worst ratio {worst:.2f} ({'met' if worst <= 2 else 'NOT met'})")
    numpy_engine.close()
    return 0
