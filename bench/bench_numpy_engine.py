"""Benchmark of the numpy engine, in-process (issue 2).

One run prints a Markdown table: for several shapes, output-only and with
weights, the engine's median time, its attention rate (4*B*H*L*S*E flop/s), the
same as a fraction of this machine's float32 matmul rate (numpy ``a @ a`` on
2048x2048, BLAS on every core), and the speed-up over a plain numpy baseline that materialises
every temporary (broadcast matmul, ``np.exp`` of the shifted scores, division)
the way a first version typically does.

A second table times tiny requests (issue 8): the one-pass path for tasks of at most
``FAST_PATH_SCORES`` scores against the general chunked path on the same task (blocks of
calls of each, interleaved, so machine load affects both alike), weights and scores returned.

The tiny table runs ``service.core``'s own steps with the path chosen (``prepare``, then ``forward_small`` or
``forward_chunked``, then the finiteness check: what ``run_attention`` does, which picks the one-pass path up to
``FAST_PATH_SCORES`` scores), and ``engine.run`` beside them, the path it takes by default.

    python -m bench numpy-engine [--repeats 7] [--blocks 15]
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from functools import partial

import numpy as np

from bench.suite import Parser
from bench.timing import all_cores, matmul_rate, median_time
from service.core.attention.forward import FAST_PATH_SCORES, forward_chunked, forward_small
from service.core.attention.prepared import prepare
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


def arguments() -> Parser:
    parser = Parser(__name__, __doc__, quick={"repeats": 1, "blocks": 1})
    parser.add_repeats(7)
    parser.add_argument("--blocks", type=int, default=15, help="interleaved blocks per tiny case (default 15)")
    return parser


def main(argv: list[str]) -> int:
    args = arguments().parse(argv)
    rng = np.random.default_rng(0)
    engine = NumpyEngine()  # as the service runs it: a worker pool, BLAS one thread per call
    engine.start()
    peak = matmul_rate(repeats=max(1, min(args.repeats, 7)))
    print(f"float32 matmul 2048^3: {peak / 1e9:.1f} GFLOP/s; engine threads: {engine.threads}")
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
    tiny_table(engine, rng, args.blocks)
    engine.close()
    return 0


def per_call(fn: Callable[[], object], calls: int) -> float:
    """Seconds per call over a block of ``calls`` calls."""
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls


def forward_path(task: AttentionTask, one_pass: bool) -> np.ndarray:
    """``run_attention``'s steps with the path chosen: the one-pass path (``forward_small``) or the chunked one
    (``forward_chunked``, on the calling thread: tiny tasks are one chunk), then the finiteness check. The output.
    """
    params = task.params
    p = prepare(task.inputs, params, task.dtype)
    d = p.dims
    dtype = p.q.dtype
    output = np.empty((d.B, d.Hq, d.L, d.Ev), dtype=dtype)
    weights = np.empty(d.weights_shape, dtype=dtype) if task.need_weights else None
    scores = np.empty(d.weights_shape, dtype=dtype) if task.need_scores else None
    if one_pass:
        forward_small(p, params.normalizer, params.alpha, output, weights, scores)
    else:
        forward_chunked(p, params, output, weights, scores, None, 1)
    if not np.isfinite(output).all():
        raise ArithmeticError("not finite")
    return output


def tiny_table(engine: NumpyEngine, rng: np.random.Generator, blocks: int) -> None:
    """The one-pass path against the chunked path on tiny tasks, and ``engine.run``: median of interleaved blocks."""
    print()
    print("| tiny task (B, H, L, E), S = L | normalizer | mask | one-pass us | chunked us | speed-up | engine.run us |")
    print("|---|---|---|---:|---:|---:|---:|")
    for shape, normalizer, mask_kind in TINY_CASES:
        B, H, L, _ = shape
        if B * H * L * L > FAST_PATH_SCORES:
            raise AssertionError(f"{shape} is not a tiny task: more than {FAST_PATH_SCORES} scores")
        q, k, v = (rng.standard_normal(shape, dtype=np.float32) for _ in range(3))
        mask = rng.random((B, H, L, L)) > 0.3 if mask_kind == "mask" else None
        params = AttentionParams(normalizer=normalizer, causal="top_left" if mask_kind == "causal" else None)
        task = AttentionTask(AttentionInputs(q, k, v, mask), params, np.dtype(np.float32), True, True)
        calls = max(10, 20000 // (B * H * L * L))
        fast, general, default = [], [], []
        for _ in range(blocks):
            fast.append(per_call(partial(forward_path, task, True), calls))
            general.append(per_call(partial(forward_path, task, False), calls))
            default.append(per_call(partial(engine.run, task), calls))
        f, g, e = statistics.median(fast), statistics.median(general), statistics.median(default)
        print(
            f"| {shape} | {normalizer} | {mask_kind or '-'} | {f * 1e6:.1f} | {g * 1e6:.1f} | {g / f:.2f}x "
            f"| {e * 1e6:.1f} |"
        )
