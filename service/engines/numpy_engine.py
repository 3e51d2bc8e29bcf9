"""The numpy engine: the reference implementation, every feature, float32 and float64."""

from __future__ import annotations

import os
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any

import numpy as np
from threadpoolctl import ThreadpoolController

from service.core.attention import check_dims, run_attention
from service.core.backward import BackwardResult, BackwardTask, run_backward
from service.core.types import AttentionResult, AttentionTask
from service.engines.cost import REFERENCE, Cost, CostModel

_DTYPE_NAMES = {np.dtype(np.float32): "float32", np.dtype(np.float64): "float64"}
"""``dtype.name`` is a Python property that takes ~2 us; the compute dtypes' names by lookup."""


def available_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


class NumpyEngine:
    """Runs :func:`service.core.attention.run_attention` in-process.

    Supports every request the contract defines, so it is the fallback of
    ``engine: "auto"``. After :meth:`start`, large requests run their chunks on
    a pool of ``threads`` worker threads (0: one per available CPU) and BLAS is
    limited to one thread per call, so the GEMMs and the element-wise softmax
    passes (which numpy runs on one core) all use every core without
    oversubscribing them. The pool is shared by concurrent requests, which
    bounds the CPU the engine uses. ``cost_model`` prices its tasks (the data
    plane's, with this machine's calibration; the reference machine's by default).
    """

    name = "numpy"

    def __init__(self, threads: int = 0, *, cost_model: CostModel = REFERENCE) -> None:
        self.threads = threads or available_cpus()
        self.cost_model = cost_model
        self._executor: ThreadPoolExecutor | None = None
        self._blas_limit: Any = None

    @property
    def provider(self) -> str:
        return "CPU/numpy"

    @property
    def ready(self) -> bool:
        return True

    def start(self) -> None:
        """Create the worker pool and limit BLAS to one thread (process-wide)."""
        if self.threads > 1 and self._executor is None:
            self._blas_limit = ThreadpoolController().limit(limits=1, user_api="blas")
            self._executor = ThreadPoolExecutor(self.threads, thread_name_prefix="numpy-engine")

    def close(self) -> None:
        """Stop the pool and give BLAS its threads back."""
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        if self._blas_limit is not None:
            self._blas_limit.restore_original_limits()
            self._blas_limit = None

    def worker_pool(self) -> tuple[Executor | None, int]:
        """The pool and its threads, for other work on arrays (:class:`~service.engines.base.Pooled`)."""
        return (self._executor, self.threads) if self._executor is not None else (None, 1)

    def unsupported_reason(self, task: AttentionTask) -> str | None:
        return None

    def cost(self, task: AttentionTask) -> Cost:
        """Estimated time and peak memory of ``task`` here (:mod:`service.engines.cost`, cached per shapes)."""
        inputs = task.inputs
        return self.cost_model.numpy_cost(
            check_dims(inputs.query.shape, inputs.key.shape, inputs.value.shape),
            normalizer=task.params.normalizer,
            alpha=task.params.alpha,
            dtype=_DTYPE_NAMES.get(task.dtype) or np.dtype(task.dtype).name,
            need_weights=task.need_weights,
            need_scores=task.need_scores,
            workers=self.threads if self._executor else 1,
        )

    def run(self, task: AttentionTask) -> AttentionResult:
        return run_attention(task, executor=self._executor, workers=self.threads if self._executor else 1)

    def backward_unsupported_reason(self, task: BackwardTask) -> str | None:
        return None

    def run_backward(self, task: BackwardTask) -> BackwardResult:
        """The backward pass (:func:`service.core.backward.run_backward`) on the same worker pool."""
        return run_backward(task, executor=self._executor, workers=self.threads if self._executor else 1)

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "provider": self.provider,
            "ready": True,
            "numpy_version": np.__version__,
            "threads": self.threads if self._executor else 1,
            "supports": "every normalizer, mask, causal alignment, float32 and float64; forward and backward",
        }
