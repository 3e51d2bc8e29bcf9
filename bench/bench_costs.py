"""Measure what the cost model in ``service/engines/cost.py`` assumes: time per score and peak memory.

For every graph in models/ and every numpy normalizer, one fresh subprocess runs one request of a
given shape (worst case for the sparse normalizers: every key a candidate of the support) and
reports its time and its peak resident memory above the state before the run (VmHWM after
``/proc/self/clear_refs`` reset it). It prints, per engine and graph, the measured peak bytes per
score next to the model's estimate, and the measured nanoseconds per score next to the model's.
The model is honest when every measured value is at most its estimate.

    python -m bench costs [--scores 4194304] [--seq 1024] [--engines onnx,numpy]

Linux only (reads /proc). Each measurement is a separate process, so arenas and caches of one
do not hide the peak of the next.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench.suite import Parser

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, math, sys, time
import numpy as np

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)

def reset_peak():
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")

spec = json.loads(sys.argv[1])
B, H, L, S, E = spec["shape"]
dtype = np.dtype(spec["dtype"])
rng = np.random.default_rng(0)
# Worst case for the sparse normalizers: scores within 1 of the row max, so every key is a candidate.
q = (rng.uniform(0.0, 0.1, (B, H, L, E))).astype(dtype)
k = (rng.uniform(0.0, 0.1, (B, H, S, E))).astype(dtype)
v = rng.standard_normal((B, H, S, E)).astype(dtype)
from service.core.types import AttentionInputs, AttentionParams, AttentionTask
mask = np.tri(L, S, k=S - L, dtype=bool) if spec["masked"] else None
task = AttentionTask(
    inputs=AttentionInputs(query=q, key=k, value=v, mask=mask),
    params=AttentionParams(normalizer=spec["normalizer"], alpha=spec["alpha"]),
    dtype=dtype, need_weights=spec["weights"], need_scores=False,
)
if spec["engine"] == "onnx":
    from service.engines.onnx_engine import OnnxEngine
    engine = OnnxEngine(spec["models_dir"])
else:
    from service.engines.numpy_engine import NumpyEngine
    engine = NumpyEngine()
engine.start()
small = AttentionTask(
    inputs=AttentionInputs(query=q[:, :, :8], key=k[:, :, :8], value=v[:, :, :8],
                           mask=None if mask is None else np.tri(8, 8, dtype=bool)),
    params=task.params, dtype=dtype, need_weights=spec["weights"], need_scores=False,
)
engine.run(small)
graph = engine.graph_for(task) if spec["engine"] == "onnx" else None
import gc; gc.collect()
base = status("VmRSS")
reset_peak()
t0 = time.perf_counter()
result = engine.run(task)
seconds = time.perf_counter() - t0
peak = status("VmHWM")
del result
gc.collect()
after = status("VmRSS")
print(json.dumps({"graph": graph, "seconds": seconds, "peak_extra": peak - base, "kept_after": after - base}))
"""


def measure(spec: dict[str, object]) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(spec)], capture_output=True, text=True, cwd=ROOT, timeout=900
    )
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def arguments() -> Parser:
    parser = Parser(__name__, __doc__, quick={"scores": 1 << 16, "seq": 256, "engines": "numpy"})
    parser.add_argument("--scores", type=int, default=1 << 22, help="B*H*L*S of each measured request")
    parser.add_argument("--seq", type=int, default=1024, help="L = S")
    parser.add_argument("--engines", default="onnx,numpy")
    return parser


def main(argv: list[str]) -> int:
    from service.core.attention import Dims
    from service.engines import cost
    from service.engines.numpy_engine import available_cpus

    args = arguments().parse(argv)

    S = args.seq
    H = max(1, args.scores // (S * S))
    E = 16
    dims = Dims(B=1, Hq=H, Hkv=H, L=S, S=S, E=E, Ev=E)
    cases = []
    for engine in args.engines.split(","):
        for normalizer, alpha in (
            ("softmax", None),
            ("relu", None),
            ("sparsemax", None),
            ("entmax15", None),
            ("entmax", 1.3),
        ):
            for dtype in ("float32", "float64"):
                for weights in (False, True):
                    if normalizer != "softmax" and not weights and engine == "onnx":
                        continue  # the primitive graphs always compute the weights
                    cases.append((engine, normalizer, alpha, dtype, weights))
    print(f"shape (1, {H}, {S}, {S}), E = {E}: {H * S * S} scores; worst case (every key a candidate); masked causal")
    print(
        "| engine | graph / normalizer | dtype | weights | ms | ns/score | model ns/score | peak MiB | model MiB | "
        "kept after run MiB |"
    )
    print("|---|---|---|---|---:|---:|---:|---:|---:|---:|")
    worst = 0.0
    for engine, normalizer, alpha, dtype, weights in cases:
        spec = {
            "shape": [1, H, S, S, E],
            "dtype": dtype,
            "normalizer": normalizer,
            "alpha": alpha,
            "engine": engine,
            "weights": weights,
            "masked": True,
            "models_dir": str(ROOT / "models"),
        }
        r = measure(spec)
        scores = H * S * S
        model = cost.estimate(
            engine,
            dims,
            normalizer=normalizer,
            alpha=alpha,
            dtype=dtype,
            need_weights=weights,
            need_scores=False,
            graph=r["graph"],
            workers=available_cpus(),
        )
        ns = float(r["seconds"]) / scores * 1e9
        peak = int(r["peak_extra"])
        worst = max(worst, peak / model.peak_bytes)
        name = r["graph"] or normalizer + (f" {alpha}" if alpha else "")
        print(
            f"| {engine} | {name} | {dtype} | {'yes' if weights else 'no'} | {float(r['seconds']) * 1e3:.1f} | "
            f"{ns:.1f} | "
            f"{model.seconds / scores * 1e9:.1f} | {peak / 2**20:.1f} | {model.peak_bytes / 2**20:.1f} | "
            f"{int(r['kept_after']) / 2**20:.1f} |",
            flush=True,
        )
    print(f"\nlargest measured peak / model peak: {worst:.2f} (the model must stay >= 1)")
    return 0
