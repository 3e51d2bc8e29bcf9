"""Timing helpers shared by the in-process benchmarks: the median of timed calls, the matmul reference rate."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import numpy as np
from threadpoolctl import ThreadpoolController

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
