"""Attention rollout of a ViT-B-sized stack against the matrix products it needs, in process and over HTTP (issue 31).

    python -m bench rollout [--repeats 5] [--layers 12] [--heads 12] [--length 512]

The stack is ``[layers, 1, heads, L, L]`` float32 softmax weights (12 x 12 x 512 x 512: 151 MB, over the default
body limit), the rollout the whole ``[1, L, L]`` answer with the defaults (mean fusion, residual 0.5), float32.

- **products**: ``layers`` float64 ``L x L`` matrix products (the rollout's own: the fusion and the products run
  in float64), numpy with BLAS on every core; the float32 products beside them for reference;
- **in process**: the data plane's job (:func:`service.dataplane.rollout.rollout`, checks, fusion and products on
  the numpy engine's pool, as the server runs it), and the same with ``rows: [0]``;
- **over HTTP**: the service as production runs it (``python -m service serve``, ``ATTN_MAX_BODY_BYTES`` raised to
  256 MiB, the memory budget to 2 GiB), ``/v2`` binary with tritonclient.http and ``/v1`` base64 with httpx; the
  transfer is the same request refused at its options (``head_fusion: "none"``) once the server has read the
  whole body: the upload, the framing and the refusal, no rollout.

Each time is the median of ``--repeats`` runs. Targets: in process within 1.5x of the products; over HTTP at most
1.3x the in-process time plus the transfer.
"""

from __future__ import annotations

import asyncio
import base64
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import tritonclient.http as th
from tritonclient.utils import InferenceServerException

from bench.serving import service
from bench.suite import Parser
from bench.timing import all_cores, median_time

TARGETS = {"in_process": 1.5, "http": 1.3}
MAX_BODY = 256 << 20
ENV = {"ATTN_MAX_BODY_BYTES": str(MAX_BODY), "ATTN_MEMORY_BUDGET_BYTES": str(2 << 30), "ATTN_MAX_WORK_FLOPS": "1e12"}


def arguments() -> Parser:
    parser = Parser(__name__, __doc__, quick={"repeats": 1, "layers": 2, "heads": 2, "length": 64})
    parser.add_repeats(5)
    parser.add_argument("--layers", type=int, default=12, help="layers of the stack (default 12)")
    parser.add_argument("--heads", type=int, default=12, help="heads per layer (default 12)")
    parser.add_argument("--length", type=int, default=512, help="L, the sequence length (default 512)")
    return parser


def softmax_stack(layers: int, heads: int, length: int) -> np.ndarray:
    """Random float32 attention weights ``[layers, 1, heads, L, L]``, each row a softmax."""
    rng = np.random.default_rng(31)
    w = rng.standard_normal((layers, 1, heads, length, length), dtype=np.float32)
    w *= 2
    w -= w.max(axis=-1, keepdims=True)
    np.exp(w, out=w)
    w /= w.sum(axis=-1, keepdims=True)
    return w


def products(layers: int, length: int, dtype: type, repeats: int) -> float:
    """Seconds of ``layers`` ``L x L`` products in ``dtype``, BLAS on every core."""
    rng = np.random.default_rng(0)
    a, b = rng.random((length, length)).astype(dtype), rng.random((length, length)).astype(dtype)
    with all_cores():
        return median_time(lambda: [a @ b for _ in range(layers)], repeats)


async def in_process(weights: np.ndarray, repeats: int) -> tuple[float, float]:
    """Seconds of the data plane's job: the whole answer, and ``rows: [0]``."""
    from service.app import create_app
    from service.dataplane import rollout as rollout_op
    from service.dataplane.timing import Timing
    from service.settings import Settings

    app = create_app(Settings(enable_onnx=False, grpc_enabled=False, log_level="warning", memory_budget_bytes=2 << 30))
    plane = app.state.plane
    async with app.router.lifespan_context(app):
        while plane.runtime.not_ready_reason() is not None:
            await asyncio.sleep(0.05)
        ctx = plane.context

        def run(rows: list[int] | None) -> Callable[[], object]:
            def call() -> object:
                job = rollout_op.rollout(
                    ctx,
                    weights,
                    None,
                    rows,
                    rollout_op.RolloutOptions(),
                    sent_as=weights.dtype,
                    precision="float32",
                    encoding="binary",
                    timing=Timing(),
                )
                with plane.memory.lease() as lease:
                    return job.run(lease)

            return call

        return median_time(run(None), repeats), median_time(run([0]), repeats)


def over_v2(rest: str, weights: np.ndarray, repeats: int) -> tuple[float, float, np.ndarray]:
    """(seconds of the /v2 binary request, seconds of the same refused at its options, the answer)."""
    client = th.InferenceServerClient(rest, network_timeout=600.0, connection_timeout=600.0)
    tensor = th.InferInput("weights", list(weights.shape), "FP32")
    tensor.set_data_from_numpy(weights, binary_data=True)
    output = [th.InferRequestedOutput("rollout", binary_data=True)]
    answer: dict[str, np.ndarray] = {}

    def call() -> None:
        answer["rollout"] = client.infer("attention_rollout", [tensor], outputs=output).as_numpy("rollout")

    def refused() -> None:
        try:
            client.infer("attention_rollout", [tensor], outputs=output, parameters={"head_fusion": "none"})
        except InferenceServerException:
            return
        raise AssertionError("the transfer floor was answered")

    return median_time(call, repeats, warmup=1), median_time(refused, repeats, warmup=1), answer["rollout"]


def over_v1(rest: str, weights: np.ndarray, repeats: int) -> tuple[float, float]:
    """(seconds of the /v1 base64 request, seconds of the same refused at its options)."""
    tensor = {"shape": list(weights.shape), "dtype": "float32", "b64": base64.b64encode(weights.tobytes()).decode()}
    url = f"http://{rest}/v1/attention/rollout"
    with httpx.Client(timeout=600.0) as client:

        def post(extra: dict[str, Any], status: int) -> Callable[[], None]:
            def call() -> None:
                r = client.post(url, json={"weights": tensor, "encoding": "base64", **extra})
                assert r.status_code == status, r.text[:300]

            return call

        return median_time(post({}, 200), repeats, warmup=1), median_time(post({"head_fusion": "none"}, 422), repeats)


def main(argv: list[str]) -> int:
    args = arguments().parse(argv)
    weights = softmax_stack(args.layers, args.heads, args.length)
    f64 = products(args.layers, args.length, np.float64, args.repeats)
    f32 = products(args.layers, args.length, np.float32, args.repeats)
    whole, one_row = asyncio.run(in_process(weights, args.repeats))
    with tempfile.TemporaryDirectory() as tmp, service(Path(tmp) / "service.log", ENV) as served:
        rest = served.rest
        v2, v2_floor, answer = over_v2(rest, weights, args.repeats)
        v1, v1_floor = over_v1(rest, weights, args.repeats)
    assert answer.shape == (1, args.length, args.length)
    np.testing.assert_allclose(answer.sum(axis=-1), 1.0, rtol=0, atol=1e-4)
    shape = f"[{args.layers}, 1, {args.heads}, {args.length}, {args.length}]"
    print(f"stack {shape} float32 ({weights.nbytes / 1e6:.0f} MB); median of {args.repeats} runs\n")
    print("| what | time (ms) | ratio |")
    print("|---|---:|---|")
    in_ratio = whole / f64
    print(f"| {args.layers} float64 L x L products, BLAS on every core | {f64 * 1e3:.1f} | |")
    print(f"| {args.layers} float32 L x L products (reference) | {f32 * 1e3:.1f} | |")
    print(f"| rollout in process, the whole [1, L, L] | {whole * 1e3:.1f} | {in_ratio:.2f}x the float64 products |")
    print(f"| rollout in process, rows [0] | {one_row * 1e3:.1f} | {one_row / f64:.2f}x the float64 products |")
    ratios = {}
    for name, total, floor in (("/v2 binary", v2, v2_floor), ("/v1 base64", v1, v1_floor)):
        ratios[name] = total / (whole + floor)
        print(f"| {name}: transfer (the request refused at its options) | {floor * 1e3:.1f} | |")
        print(f"| {name}: the rollout | {total * 1e3:.1f} | {ratios[name]:.2f}x in process + transfer |")
    print()
    verdict = "met" if in_ratio <= TARGETS["in_process"] else "missed"
    print(f"- in process / float64 products: {in_ratio:.2f} (target <= {TARGETS['in_process']}): {verdict}")
    for name, ratio in ratios.items():
        verdict = "met" if ratio <= TARGETS["http"] else "missed"
        print(f"- {name} / (in process + transfer): {ratio:.2f} (target <= {TARGETS['http']}): {verdict}")
    print(f"\nload average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0
