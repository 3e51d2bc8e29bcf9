"""Benchmark of /v1/sample: in-process and over HTTP, against a plain numpy version with full sorts.

For (1, 32000), (1, 256000) and (64, 32000) float32 logits with ``top_k`` 50 and ``top_p`` 0.9 (one
draw per row, a fixed seed, the default answer: tokens, logprobs, diagnostics) it measures, in one run:

- **core**: ``service.core.sampling`` on the decoded array: steps 1-8 (partial selection), the draw,
  and the raw statistics the diagnostics need;
- **plain numpy**: the same outputs the textbook way (Hugging Face's warpers written in numpy): full
  ``np.sort`` for the k-th value, a full ``argsort`` for top-p, softmax over the whole vocabulary,
  and the draw by inverse CDF over the whole row;
- **handler**: the route's whole CPU work in-process (parse the base64 body, validate, decode,
  compute, serialize the JSON answer);
- **HTTP**: ``python -m service serve`` (uvicorn, every middleware) on a free port, one persistent
  connection, the same body; p50 of the round trip.

Usage: ``python -m bench sample [--repeats 30]``. Prints a Markdown table for docs/benchmarks/sampling.md.
"""

from __future__ import annotations

import base64
import http.client
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import orjson

from bench.serving import service
from bench.suite import Parser
from bench.timing import median_time
from service.app import create_app
from service.core import sampling
from service.dataplane.context import Context
from service.dataplane.memory import MemoryLease
from service.dataplane.timing import Timing
from service.http.v1.logits import SAMPLE
from service.settings import Settings

SHAPES = [(1, 32000), (1, 256000), (64, 32000)]
TOP_K, TOP_P, SEED = 50, 0.9, 1234


def logits_for(shape: tuple[int, int]) -> np.ndarray:
    """LLM-like logits: a heavy upper tail over a normal bulk (float32)."""
    rng = np.random.default_rng(0)
    z = rng.standard_normal(shape, dtype=np.float32) * 2
    z += rng.gumbel(size=shape).astype(np.float32) * 2
    return z


def body_for(z: np.ndarray) -> bytes:
    tensor = {"shape": list(z.shape), "dtype": "float32", "b64": base64.b64encode(z.tobytes()).decode()}
    return orjson.dumps({"logits": tensor, "top_k": TOP_K, "top_p": TOP_P, "seed": SEED})


def ours(z: np.ndarray) -> tuple[np.ndarray, sampling.Filtered]:
    """The service's core: steps 1-8, one draw per row, raw statistics for the diagnostics."""
    raw = sampling.raw_stats(z)
    filtered, _ = sampling.process(z, sampling.SamplingParams(top_k=TOP_K, top_p=TOP_P), raw=raw)
    tokens, _ = sampling.draw(filtered, sampling.uniforms(SEED, (z.shape[0], 1)))
    return tokens, filtered


def plain(z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The same outputs with full sorts (Hugging Face's TopK/TopP warpers, in numpy)."""
    n, v = z.shape
    raw = z - z.max(axis=1, keepdims=True)
    e = np.exp(raw)
    s = e.sum(axis=1, keepdims=True)
    _entropy_raw = np.log(s[:, 0]) - (e * raw).sum(axis=1) / s[:, 0]
    y = raw.copy()
    kth = np.sort(y, axis=1)[:, -TOP_K][:, None]  # TopKLogitsWarper: a full sort for the k-th value
    y[y < kth] = -np.inf
    order = np.argsort(-y, axis=1, kind="stable")  # TopPLogitsWarper: a full argsort
    p = np.exp(y - y.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    sp = np.take_along_axis(p, order, axis=1)
    remove_sorted = np.cumsum(sp, axis=1) - sp >= TOP_P
    remove = np.zeros_like(remove_sorted)
    np.put_along_axis(remove, order, remove_sorted, axis=1)
    p[remove] = 0
    p /= p.sum(axis=1, keepdims=True)
    _entropy = -np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1)), 0), axis=1)
    _removed = 1 - (e * (p > 0)).sum(axis=1) / s[:, 0]
    cdf = np.cumsum(p, axis=1, dtype=np.float64)
    u = sampling.uniforms(SEED, (n, 1))
    tokens = (cdf <= u * cdf[:, -1:]).sum(axis=1, keepdims=True)
    return tokens, p


def median_ms(fn: Callable[[], object], repeats: int) -> float:
    return median_time(fn, repeats) * 1e3


def http_ms(port: int, body: bytes, repeats: int) -> float:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    headers = {"content-type": "application/json"}

    def once() -> None:
        conn.request("POST", "/v1/sample", body=body, headers=headers)
        r = conn.getresponse()
        data = r.read()
        if r.status != 200:
            raise SystemExit(f"HTTP {r.status}: {data[:500]!r}")

    try:
        return median_ms(once, repeats)
    finally:
        conn.close()


def arguments() -> Parser:
    parser = Parser(__name__, __doc__, quick={"repeats": 1})
    parser.add_repeats(30)
    return parser


def handled(ctx: Context, body: bytes) -> bytes:
    """What the door runs for one /v1/sample body: the route's decode, the operation, the route's encode."""
    request = SAMPLE.decode(ctx, SAMPLE, body, "")
    return SAMPLE.encode(SAMPLE, request, SAMPLE.prepare(ctx, request, Timing()).run(MemoryLease(None)))


def main(argv: list[str]) -> int:
    args = arguments().parse(argv)
    app = create_app(Settings(enable_onnx=False))
    ctx = app.state.plane.context
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        settings = {"ATTN_ENABLE_ONNX": "false"}
        with service(Path(tmp) / "server.log", settings) as served:
            port = int(served.rest.rsplit(":", 1)[1])
            for shape in SHAPES:
                z = logits_for(shape)
                body = body_for(z)
                t_ours, filtered = ours(z)
                t_plain, p_plain = plain(z)
                np.testing.assert_allclose(filtered.dense(np.float32), p_plain, rtol=1e-5, atol=1e-7)
                assert np.array_equal(t_ours, t_plain), "same seed, same distribution: same tokens"
                core = median_ms(lambda z=z: ours(z), args.repeats)
                base = median_ms(lambda z=z: plain(z), args.repeats)
                handler = median_ms(lambda body=body: handled(ctx, body), args.repeats)
                over_http = http_ms(port, body, args.repeats)
                rows.append((shape, len(body), core, base, handler, over_http))
    print(
        f"load average after: {os.getloadavg()[0]:.2f}; top_k {TOP_K}, top_p {TOP_P}, float32, n = 1, "
        f"median of {args.repeats}"
    )
    print()
    print(
        "| logits (N, V) | body bytes | core ms | plain numpy (full sorts) ms | speed-up | "
        "handler in-process ms | HTTP p50 ms |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for shape, size, core, base, handler, over_http in rows:
        print(f"| {shape} | {size} | {core:.2f} | {base:.2f} | {base / core:.1f}x | {handler:.2f} | {over_http:.2f} |")
    return 0
