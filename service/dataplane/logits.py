"""Operations on logits: normalizing them (:func:`softmax`) and fitting a temperature to labelled ones
(:func:`calibrate`). Sampling is :mod:`service.dataplane.sampling`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from service.core import calibration
from service.core.diagnostics import probability_diagnostics
from service.core.probabilities import normalize_logits
from service.dataplane import budget
from service.dataplane.attention import check_alpha
from service.dataplane.context import Context
from service.dataplane.errors import invalid
from service.dataplane.memory import MemoryLease
from service.dataplane.options import CalibrateOptionsLike, SoftmaxOptionsLike
from service.dataplane.scheduling import Job
from service.dataplane.tensors import finite_as, float_mask_as
from service.dataplane.timing import Timing

SOFTMAX_TIMING_ORDER = ("decode", "compute", "diagnostics")
CALIBRATE_TIMING_ORDER = ("decode", "compute")


@dataclass(slots=True)
class SoftmaxOutcome:
    probabilities: np.ndarray
    log_probabilities: np.ndarray | None
    diagnostics: dict[str, Any]
    timing: Timing


def softmax(
    ctx: Context,
    logits: np.ndarray,
    mask: np.ndarray | None,
    options: SoftmaxOptionsLike,
    *,
    precision: str,
    encoding: str,
    timing: Timing,
) -> Job[SoftmaxOutcome]:
    """Normalize ``logits`` along ``options.axis``: ``(logits + float mask) / temperature``, then the normalizer;
    a boolean mask removes positions.
    """
    dtype = np.dtype(precision)
    logits = finite_as(logits, dtype, "logits")
    mask = float_mask_as(mask, dtype)
    check_alpha(options.normalizer, options.alpha)
    flops, size = budget.softmax_estimate(
        logits.shape, options.axis, options.normalizer, options.log, precision, encoding, options.alpha, costs=ctx.costs
    )
    memory = budget.softmax_memory(logits.shape, options.log, precision, size)
    budget.enforce(ctx.budget, flops, size, memory)
    timing.phase("decode")

    def run(lease: MemoryLease) -> SoftmaxOutcome:
        timing.skip()
        result = normalize_logits(
            logits,
            normalizer=options.normalizer,
            alpha=options.alpha,
            temperature=options.temperature,
            mask=mask,
            axis=options.axis,
            with_log=options.log,
            dtype=dtype,
        )
        timing.phase("compute")
        diagnostics = probability_diagnostics(result.probabilities, axis=options.axis)
        timing.phase("diagnostics")
        return SoftmaxOutcome(result.probabilities, result.log_probabilities, diagnostics, timing)

    return Job(flops, size, memory, run)


@dataclass(slots=True)
class CalibrateOutcome:
    temperature: float
    nll_before: float
    nll_after: float
    ece_before: float
    ece_after: float
    accuracy: float
    reliability_before: list[dict[str, Any]]
    reliability_after: list[dict[str, Any]]
    bounded: bool
    timing: Timing


def calibrate(
    ctx: Context, logits: np.ndarray, labels: np.ndarray, options: CalibrateOptionsLike, *, timing: Timing
) -> Job[CalibrateOutcome]:
    """Temperature scaling (Guo et al. 2017): the T in [0.01, 100] minimizing the mean NLL of the labels,
    with NLL, expected calibration error and reliability bins before (T = 1) and after; in float64.
    """
    if labels.size == 0:
        raise invalid("labels is empty (N = 0): nothing to calibrate", "labels")
    if labels.dtype.kind not in "iu":
        labels = labels.astype(np.int64)
    flops, size, memory = budget.calibrate_estimate(logits.shape[0], logits.shape[1], options.bins)
    budget.enforce(ctx.budget, flops, size, memory)
    logits = finite_as(logits, np.dtype(np.float64), "logits")
    timing.phase("decode")

    def run(lease: MemoryLease) -> CalibrateOutcome:
        timing.skip()
        result = calibration.calibrate(logits, labels, options.bins)
        timing.phase("compute")
        return CalibrateOutcome(
            temperature=result.fit.temperature,
            nll_before=result.nll_before,
            nll_after=result.nll_after,
            ece_before=result.before.ece,
            ece_after=result.after.ece,
            accuracy=result.before.accuracy,
            reliability_before=result.before.bins(),
            reliability_after=result.after.bins(),
            bounded=result.fit.bounded,
            timing=timing,
        )

    return Job(flops, size, memory, run)
