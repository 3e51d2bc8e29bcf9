"""One case of ``python -m bench kernels``, in a process of its own, so that its peak RSS is its own.

``python -m bench.kernel_case ENGINE B HQ HKV L S E WEIGHTS REPEATS``: ENGINE ``numpy``, ``onnx``, ``auto`` (the
engine the service's dispatcher picks) or ``torch`` (PyTorch's ``scaled_dot_product_attention`` for output only, the
unfused ``softmax(Q K^T * scale) V`` with weights, on as many threads as this process may use). Prints one JSON
line: the median milliseconds (after one warm-up call), the growth of peak RSS over the process once its inputs and
engine are ready (the warm-up call included: the first call is the one that allocates) and the engine and graph that
ran.
"""

from __future__ import annotations

import json
import os
import resource
import sys
from typing import Any

import numpy as np


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e6  # ru_maxrss: KiB on Linux


def median_ms(fn: Any, repeats: int) -> float:
    import time

    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times) * 1e3)


def torch_case(B: int, Hq: int, Hkv: int, L: int, S: int, E: int, weights: bool, repeats: int) -> dict[str, Any]:
    import torch

    torch.set_num_threads(len(os.sched_getaffinity(0)))
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, Hq, L, E, generator=g)
    k = torch.randn(B, Hkv, S, E, generator=g)
    v = torch.randn(B, Hkv, S, E, generator=g)
    F = torch.nn.functional
    scale = E**-0.5

    def run() -> object:
        with torch.no_grad():
            if weights:
                kk = k.repeat_interleave(Hq // Hkv, dim=1) if Hq != Hkv else k
                vv = v.repeat_interleave(Hq // Hkv, dim=1) if Hq != Hkv else v
                w = torch.softmax(q @ kk.transpose(-1, -2) * scale, dim=-1)
                return w @ vv, w
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=Hq != Hkv)

    before = peak_mb()
    run()  # the warm-up call, inside the measured peak: the first call is the one that allocates
    ms = median_ms(run, repeats)
    return {"ms": ms, "rss_mb": peak_mb() - before, "engine": f"torch {torch.__version__}", "graph": ""}


def service_case(
    engine: str, B: int, Hq: int, Hkv: int, L: int, S: int, E: int, weights: bool, repeats: int
) -> dict[str, Any]:
    from service.core.types import AttentionInputs, AttentionParams, AttentionTask
    from service.engines.dispatch import EngineDispatcher
    from service.engines.numpy_engine import NumpyEngine
    from service.engines.onnx_engine import OnnxEngine
    from service.export import DEFAULT_MODELS_DIR

    rng = np.random.default_rng(0)
    q = rng.standard_normal((B, Hq, L, E), dtype=np.float32)
    k = rng.standard_normal((B, Hkv, S, E), dtype=np.float32)
    v = rng.standard_normal((B, Hkv, S, E), dtype=np.float32)
    task = AttentionTask(
        inputs=AttentionInputs(query=q, key=k, value=v),
        params=AttentionParams(),
        dtype=np.dtype(np.float32),
        need_weights=weights,
        need_scores=False,
    )
    numpy_engine = NumpyEngine()
    onnx = OnnxEngine(DEFAULT_MODELS_DIR)
    engines = {"numpy": numpy_engine, "onnx": onnx}
    dispatcher = EngineDispatcher(engines)
    numpy_engine.start()
    onnx.start()
    before = peak_mb()
    _, choice = dispatcher.run(task, engine)  # the warm-up call, inside the measured peak
    ms = median_ms(lambda: dispatcher.run(task, engine), repeats)
    graph = onnx.graph_for(task) if choice.name == "onnx" else ""
    numpy_engine.close()
    return {"ms": ms, "rss_mb": peak_mb() - before, "engine": choice.name, "graph": graph or ""}


def main(argv: list[str]) -> int:
    engine = argv[0]
    B, Hq, Hkv, L, S, E, weights, repeats = (int(x) for x in argv[1:9])
    if engine == "torch":
        result = torch_case(B, Hq, Hkv, L, S, E, bool(weights), repeats)
    else:
        result = service_case(engine, B, Hq, Hkv, L, S, E, bool(weights), repeats)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
