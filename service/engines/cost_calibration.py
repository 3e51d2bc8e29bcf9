"""Calibration of the cost model to this machine: the reference's constants scaled where this CPU is slower.

The constants of :mod:`service.engines.cost` are the reference machine's, and CPUs differ by kernel: a machine with
twice the reference's GEMM rate ran the sort-based normalizers at half its speed (sparsemax at (1, 1, 15746, 1) took
7.15 CPU-seconds against an estimate of 4). :func:`calibrate` (``python -m service serve`` calls it once, before the
server listens, and hands the factors to its workers through ``ATTN_COST_CALIBRATION``) times each kernel on
worst-case tasks of two million scores (every key a candidate of the support) at two row lengths, on one thread, and
scales the model wherever this machine is slower than the reference: ``factor = max(1, measured / modelled)``, the
larger of the two lengths, for GEMM and for each normalizer (ONNX graphs take their normalizer's factor). A faster
machine keeps the reference's estimates, so a request near the work cap takes at most about the cap's time on any
machine (within the noise of a one-second measurement: it takes the quickest of two runs).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from functools import partial

from service.core.attention import Dims
from service.core.normalizers import NEAR_ONE
from service.engines.cost import KERNELS, REFERENCE_GEMM_FLOPS_PER_S, reference_ns_per_score, scores

logger = logging.getLogger("service.engines")

CALIBRATION_ROWS = ((2048, 1024), (512, 4096))
"""(L, S) of the timed tasks: two million scores each (fixed costs per call, large for relu below a million scores,
are then a small part), rows of one and of four thousand keys (the per-score cost of the sort-based kernels moves
with the row length, by cache)."""
CALIBRATION_BISECTION_ROWS = ((32, 1024), (8, 4096))
"""The same for the bisection (a microsecond or more per score): 32,768 scores each."""
CALIBRATION_ALPHAS = {"entmax": (1.3, 1.0 + NEAR_ONE / 4)}
"""Both forms of the bisection (a power, and log1p and exp near alpha = 1): the kernel takes the slower."""
CALIBRATION_GEMM = 384
"""A (n, n) @ (n, n) float32 product times the GEMM rate."""


def _cpu_seconds(run: Callable[[], object], repeats: int) -> float:
    """The least process CPU time of ``repeats`` runs (the least is the machine's speed; the rest is noise)."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.process_time()
        run()
        best = min(best, time.process_time() - t0)
    return best


def measure(repeats: int = 2) -> dict[str, float]:
    """The time this machine takes over the model's (uncalibrated), for GEMM and each kernel: the largest over the
    timed row lengths, in float32, on one thread (BLAS limited to one thread, as the numpy engine runs it), worst case
    for the sparse kernels.
    """
    from threadpoolctl import ThreadpoolController

    with ThreadpoolController().limit(limits=1, user_api="blas"):
        return _measure(repeats)


def _measure(repeats: int) -> dict[str, float]:
    """:func:`measure` with BLAS on one thread."""
    import numpy as np

    from service.core.attention.forward import run_attention
    from service.core.types import AttentionInputs, AttentionParams, AttentionTask

    rng = np.random.default_rng(0)
    n = CALIBRATION_GEMM
    a = rng.standard_normal((n, n)).astype(np.float32)
    ratios = {"gemm": _cpu_seconds(lambda: a @ a, repeats + 1) / (2.0 * n**3 / REFERENCE_GEMM_FLOPS_PER_S)}
    for kernel in KERNELS:
        sizes = CALIBRATION_BISECTION_ROWS if kernel == "entmax" else CALIBRATION_ROWS
        for alpha in CALIBRATION_ALPHAS.get(kernel, (None,)):
            for L, S in sizes:
                dims = Dims(B=1, Hq=1, Hkv=1, L=L, S=S, E=1, Ev=1)
                # scores within 0.01 of each other: every key a candidate of the sparse normalizers' support
                task = AttentionTask(
                    inputs=AttentionInputs(
                        query=rng.uniform(0.0, 0.1, (1, 1, L, 1)).astype(np.float32),
                        key=rng.uniform(0.0, 0.1, (1, 1, S, 1)).astype(np.float32),
                        value=rng.standard_normal((1, 1, S, 1)).astype(np.float32),
                    ),
                    params=AttentionParams(normalizer=kernel, alpha=alpha),
                    dtype=np.dtype(np.float32),
                    need_weights=True,
                    need_scores=False,
                )
                modelled = 2.0 * scores(dims) * 2 / REFERENCE_GEMM_FLOPS_PER_S + scores(dims) * 1e-9 * (
                    reference_ns_per_score(kernel, alpha, "float32")
                )
                ratio = _cpu_seconds(partial(run_attention, task), repeats) / modelled
                ratios[kernel] = max(ratios.get(kernel, 0.0), ratio)
    return ratios


def calibrate(repeats: int = 2) -> dict[str, float]:
    """Measure this machine (:func:`measure`) and scale the model where it is slower than the reference (factors of at
    least 1: a faster machine keeps the reference's estimates); returns the factors, for a
    :class:`~service.engines.cost.CostModel` (``serve`` hands them to its workers as ``ATTN_COST_CALIBRATION``).
    """
    t0 = time.perf_counter()
    measured = measure(repeats)
    factors = {kernel: round(max(1.0, ratio), 3) for kernel, ratio in measured.items()}
    logger.info(
        "cost model calibrated in %.0f ms: %s",
        (time.perf_counter() - t0) * 1e3,
        ", ".join(f"{k} x{factors[k]:.2f} (measured {measured[k]:.2f})" for k in factors),
    )
    return factors


def format_factors(factors: Mapping[str, float]) -> str:
    """``gemm=1,softmax=1.13,...``: factors as ``ATTN_COST_CALIBRATION`` takes them."""
    return ",".join(f"{k}={v:g}" for k, v in factors.items())


def parse_factors(text: str) -> dict[str, float]:
    """The factors of ``gemm=1,sparsemax=1.7``; ValueError when malformed."""
    out: dict[str, float] = {}
    for part in text.split(","):
        name, sep, value = part.strip().partition("=")
        if not sep:
            raise ValueError(f"{part.strip()!r} is not kernel=factor")
        out[name.strip()] = float(value)
    unknown = set(out) - {"gemm", *KERNELS}
    if unknown or any(not v > 0 for v in out.values()):
        raise ValueError(f"calibration factors are 'gemm' and {', '.join(KERNELS)}, each > 0; got {text!r}")
    return out
