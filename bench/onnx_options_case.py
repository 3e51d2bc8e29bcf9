"""One case of ``python -m bench onnx-options``, in a process of its own, so that its peak and held memory are its own.

``python -m bench.onnx_options_case ARENA MODE GRAPH B H L E WEIGHTS REPEATS``: ARENA ``0`` or ``1`` (ONNX Runtime's
CPU memory arena), MODE ``run`` (``InferenceSession.run``, as the engine calls it) or ``bound`` (IO binding: the
inputs bound in place, ``output`` written into a preallocated array, ``weights`` bound to the CPU for ONNX Runtime to
allocate: the graph declares its last dimension as 0, so no preallocated buffer fits it). GRAPH is a graph of the
manifest in ``models/``, opened alone with the engine's own session options (:func:`.sessions.open_sessions`) and fed
by the engine's own feeds (:func:`.feeds.graph_feeds`). Prints one JSON line: the median milliseconds after one
warm-up call, the growth of peak RSS over the ready process (the warm-up call included), and what the process still
holds over the ready process after the calls and a trim of the C heap (the engine trims after every large run).
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import numpy as np

from bench.kernel_case import peak_mb


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 1e6


def main(argv: list[str]) -> int:
    import onnxruntime as ort

    from service.core.types import AttentionInputs, AttentionParams, AttentionTask
    from service.engines.onnx_engine.feeds import graph_feeds
    from service.engines.onnx_engine.heap import release_free_heap
    from service.engines.onnx_engine.manifest import verify_models
    from service.engines.onnx_engine.sessions import open_sessions
    from service.export import DEFAULT_MODELS_DIR

    arena, mode, graph = argv[0] == "1", argv[1], argv[2]
    B, H, L, E, weights, repeats = (int(x) for x in argv[3:9])
    manifest, blobs = verify_models(DEFAULT_MODELS_DIR)
    entry = next(g for g in manifest["graphs"] if g["name"] == graph)
    sessions, _ = open_sessions(
        ort,
        {**manifest, "graphs": [entry]},
        {graph: blobs[graph]},
        providers=["CPUExecutionProvider"],
        intra_op_threads=0,
        graph_optimization_level="all",
        memory_arena=arena,
        warmup=True,
    )
    session = sessions[graph]
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((B, H, L, E), dtype=np.float32) for _ in range(3))
    task = AttentionTask(
        inputs=AttentionInputs(query=q, key=k, value=v),
        params=AttentionParams(),
        dtype=np.dtype(np.float32),
        need_weights=bool(weights),
        need_scores=False,
    )
    names = frozenset(i.name for i in session.get_inputs())
    dtypes = {i["name"]: np.dtype(i["dtype"]) for i in entry["inputs"]}
    feeds, _, _, _ = graph_feeds(task, names, dtypes)
    wanted = ["output"] + (["weights"] if weights else [])

    def run() -> Any:
        return session.run(wanted, feeds)

    def bound() -> Any:
        output = np.empty((B, H, L, E), dtype=np.float32)  # a fresh answer per call, as the engine hands it on
        binding = session.io_binding()
        for name, array in feeds.items():
            binding.bind_cpu_input(name, array)
        binding.bind_output("output", "cpu", 0, np.float32, list(output.shape), output.ctypes.data)
        if weights:
            binding.bind_output("weights", "cpu")
        session.run_with_iobinding(binding)
        return [output] + (binding.copy_outputs_to_cpu()[1:] if weights else [])

    call = run if mode == "run" else bound
    release_free_heap()
    ready_rss, ready_peak = rss_mb(), peak_mb()
    if not np.array_equal(call()[0], run()[0]):
        raise SystemExit("the bound run's output differs from session.run's")
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    release_free_heap()  # as the engine does after a large run: what stays is what the arena (or ORT) keeps
    result = {
        "ms": float(np.median(times) * 1e3),
        "peak_mb": peak_mb() - ready_peak,
        "held_mb": rss_mb() - ready_rss,
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
