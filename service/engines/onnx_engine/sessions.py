"""ONNX Runtime sessions: one per graph of the manifest, with the engine's options, each warmed up once."""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

OPTIMIZATION_LEVELS = ("disable", "basic", "extended", "all")


def open_sessions(
    ort: Any,
    manifest: dict[str, Any],
    blobs: dict[str, bytes],
    *,
    providers: list[str],
    intra_op_threads: int,
    graph_optimization_level: str,
    memory_arena: bool,
    warmup: bool,
) -> tuple[dict[str, Any], dict[str, dict[str, float]]]:
    """One :class:`onnxruntime.InferenceSession` per graph of ``manifest`` (from ``blobs``), in manifest order,
    and their load and warm-up times in milliseconds.
    """
    levels = {
        "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }

    def session_options(log_severity_level: int) -> Any:
        options = ort.SessionOptions()
        options.intra_op_num_threads = intra_op_threads
        options.graph_optimization_level = levels[graph_optimization_level]
        options.log_severity_level = log_severity_level
        # Without the arena, ONNX Runtime returns each run's buffers to the allocator: an 8192-key
        # entmax request no longer leaves RSS at its 3.9 GB peak, and peaks are lower (the arena
        # rounds its extensions up). Repeated large requests pay for fresh pages instead.
        options.enable_cpu_mem_arena = memory_arena
        return options

    # onnx's shape inference gives the Attention operator's qk_matmul_output a last dim of 0
    # when kv_len is symbolic, and ONNX Runtime then logs a shape warning on every run of the
    # fused weights graph: run that one at log level error (see service/export/graphs/fused.py).
    normal, quiet = session_options(2), session_options(3)
    sessions: dict[str, Any] = {}
    timings: dict[str, dict[str, float]] = {}
    for g in manifest["graphs"]:
        supports = g["supports"]
        opts = quiet if supports["fused_attention_op"] and supports["weights"] else normal
        t0 = time.perf_counter()
        session = ort.InferenceSession(blobs[g["name"]], sess_options=opts, providers=providers)
        t1 = time.perf_counter()
        if warmup:
            session.run(None, warmup_feeds(g))
        t2 = time.perf_counter()
        sessions[g["name"]] = session
        timings[g["name"]] = {"load_ms": round((t1 - t0) * 1e3, 3), "warmup_ms": round((t2 - t1) * 1e3, 3)}
    return sessions, timings


def warmup_feeds(entry: dict[str, Any]) -> dict[str, np.ndarray]:
    """Small inputs for one warm-up run: GQA (4 query heads on 2 kv heads) where the graph takes it, a causal mask,
    as many query rows as the graph is chosen for.
    """
    supports = entry["supports"]
    dtype = np.dtype(supports["dtype"])
    types = {i["name"]: np.dtype(i["dtype"]) for i in entry["inputs"]}
    rng = np.random.default_rng(0)
    B, Hq, S, E, Ev = 1, 4, 5, 8, 8
    Hkv = 2 if supports.get("gqa", True) else Hq
    L = max(3, int(supports.get("min_q_len", 1)))
    feeds = {
        "query": rng.standard_normal((B, Hq, L, E)).astype(dtype),
        "key": rng.standard_normal((B, Hkv, S, E)).astype(dtype),
        "value": rng.standard_normal((B, Hkv, S, Ev)).astype(dtype),
        "keep_mask": np.tri(L, S, k=S - L, dtype=bool).reshape(1, 1, L, S),
        "bias": np.zeros((1, 1, 1, 1), dtype=dtype),
        "scale": np.array(1 / math.sqrt(E), dtype=types.get("scale", dtype)),
        "temperature": np.array(1.0, dtype=types.get("temperature", dtype)),
        "alpha": np.array(1.7, dtype=types.get("alpha", dtype)),
        "grad_output": rng.standard_normal((B, Hq, L, Ev)).astype(dtype),
        "grad_weights": np.zeros((1, 1, 1, 1), dtype=dtype),
    }
    names = {i["name"] for i in entry["inputs"]}
    return {k: v for k, v in feeds.items() if k in names}
