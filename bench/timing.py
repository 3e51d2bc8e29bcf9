"""Timing helpers shared by the in-process benchmarks (run as scripts: ``bench/`` is on sys.path)."""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from threadpoolctl import ThreadpoolController, threadpool_info

from service.engines.numpy_engine import available_cpus


def median_time(fn: Callable[[], object], repeats: int, warmup: int = 2) -> float:
    """Median seconds of ``repeats`` calls after ``warmup`` untimed ones."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def all_cores() -> object:
    """BLAS on every core, as plain numpy runs (the numpy engine limits it to one thread per call)."""
    return ThreadpoolController().limit(limits=available_cpus(), user_api="blas")


def matmul_rate(n: int = 2048, repeats: int = 7) -> float:
    """float32 ``a @ a`` rate in flop/s with BLAS on every core: the machine's physical reference."""
    a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    with all_cores():
        return 2 * n**3 / median_time(lambda: a @ a, repeats)


def machine() -> dict[str, Any]:
    """What runs the benchmark: CPU, cores, versions, the BLAS kernel, the load average."""
    lines = Path("/proc/cpuinfo").read_text().splitlines()
    cpu = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "unknown")
    blas = [f"{i.get('internal_api')} {i.get('version')} {i.get('architecture')}" for i in threadpool_info()]
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "grpcio": grpc.__version__,
        "blas": blas,
        "load": [round(x, 2) for x in os.getloadavg()],
    }
