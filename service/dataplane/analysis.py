"""The analysis operation: a sweep over scales, temperatures and head dimensions of what they do to the
scores, the weights and their gradients (:mod:`service.core.analysis`), on sent or drawn queries and keys.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from service.core.analysis import SweepRow, analyze, draw_normal, sweep_points
from service.core.attention import Dims, check_dims, check_params
from service.core.types import AttentionParams, Causal
from service.dataplane import budget
from service.dataplane.attention import check_alpha
from service.dataplane.context import Context
from service.dataplane.errors import invalid, too_large
from service.dataplane.memory import MemoryLease
from service.dataplane.scheduling import Job
from service.dataplane.tensors import finite_as
from service.dataplane.timing import Timing

TIMING_ORDER = ("decode", "compute")


class AnalyzeOptionsLike(Protocol):
    """The options of an analysis (the /v1 request model has them)."""

    @property
    def shape(self) -> list[int] | None: ...
    @property
    def seed(self) -> int: ...
    @property
    def scales(self) -> list[float] | None: ...
    @property
    def temperatures(self) -> list[float]: ...
    @property
    def head_dims(self) -> list[int] | None: ...
    @property
    def normalizer(self) -> str: ...
    @property
    def alpha(self) -> float | None: ...
    @property
    def causal_alignment(self) -> Causal | None: ...
    @property
    def key_lengths(self) -> list[int] | None: ...
    @property
    def vanishing_threshold(self) -> float: ...


@dataclass(slots=True)
class AnalysisOutcome:
    """The sweep, with what it was computed on."""

    sweep: list[SweepRow]
    normalizer: str
    shape: list[int]
    """[B, H, L, S] of the scores."""
    kv_heads: int
    seed: int | None
    """The seed of the draw (None when query and key were sent)."""
    vanishing_threshold: float
    saturation_margin: float
    timing: Timing


def check_sources(options: AnalyzeOptionsLike, query_given: bool, key_given: bool) -> None:
    """Query and key are sent, or drawn from ``shape``: never both, never neither (checked before decoding them)."""
    given = {"query": query_given, "key": key_given}
    if options.shape is not None:
        for name, present in given.items():
            if present:
                raise invalid(f"send either query and key, or shape to draw them; not both ({name} given)", name)
        return
    for name, present in given.items():
        if not present:
            raise invalid(f"{name} is required unless shape is given (to draw query and key)", name)
    if options.head_dims is not None:
        raise invalid("head_dims sweeps drawn inputs only: give shape instead of query and key", "head_dims")


def _check_drawn_shape(ctx: Context, shape: tuple[int, ...]) -> None:
    """A drawn tensor obeys the limits of a sent one: ``INVALID`` past the dimension limit, ``TOO_LARGE`` past
    the element limit.
    """
    for axis, size in enumerate(shape):
        if size > ctx.limits.max_dim:
            raise invalid(f"shape[{axis}] = {size} is above the limit of {ctx.limits.max_dim}", "shape", axis)
    count = math.prod(shape)
    if count > ctx.limits.max_elements:
        raise too_large(
            f"the drawn query and key of shape {list(shape)} would have {count} elements each, above the limit of "
            f"{ctx.limits.max_elements}; draw fewer (smaller shape or head_dims)"
        )


def analysis(
    ctx: Context,
    options: AnalyzeOptionsLike,
    query: np.ndarray | None,
    key: np.ndarray | None,
    mask: np.ndarray | None,
    *,
    timing: Timing,
) -> Job[AnalysisOutcome]:
    """One analysis: ``query`` and ``key`` as sent (:func:`check_sources` passed), or None to draw them from
    ``options.shape``; ``mask`` already in float64 or boolean (``float_mask_as``).
    """
    drawn = options.shape is not None
    head_dims: Sequence[int]
    if drawn:
        assert options.shape is not None
        B, H, L, E = options.shape
        head_dims = list(options.head_dims) if options.head_dims is not None else [E]
        for e in head_dims:
            _check_drawn_shape(ctx, (B, H, L, e))
        Hkv, S = H, L
    else:
        assert query is not None and key is not None
        sent = check_dims(query.shape, key.shape, key.shape)
        float64 = np.dtype(np.float64)
        query, key = finite_as(query, float64, "query"), finite_as(key, float64, "key")
        B, H, Hkv, L, S, E = sent.B, sent.Hq, sent.Hkv, sent.L, sent.S, sent.E
        head_dims = [E]
    check_alpha(options.normalizer, options.alpha)
    check_params(AttentionParams(normalizer=options.normalizer, alpha=options.alpha, causal=options.causal_alignment))
    key_lengths = None if options.key_lengths is None else np.asarray(options.key_lengths, dtype=np.int64)
    points = sweep_points(head_dims, options.scales, options.temperatures)
    per_dim = len(points) // len(head_dims)
    dims = Dims(B=B, Hq=H, Hkv=Hkv, L=L, S=S, E=max(head_dims), Ev=max(head_dims))
    flops, size = budget.analyze_estimate(
        dims, head_dims, per_dim, options.normalizer, options.alpha, drawn, costs=ctx.costs
    )
    memory = budget.analyze_memory(dims, head_dims, size)
    budget.enforce(ctx.budget, flops, size, memory)
    timing.phase("decode")

    def run(lease: MemoryLease) -> AnalysisOutcome:
        timing.skip()
        q, k = query, key
        rows: list[SweepRow] = []
        for e in head_dims:
            if drawn:
                q, k = draw_normal((B, H, L, e), options.seed)
            assert q is not None and k is not None
            rows += analyze(
                q,
                k,
                points=[pt for pt in points if pt.head_dim == e],
                normalizer=options.normalizer,
                alpha=options.alpha,
                mask=mask,
                causal=options.causal_alignment,
                key_lengths=key_lengths,
                vanishing_threshold=options.vanishing_threshold,
                saturation_margin=ctx.saturation_margin,
            )
        timing.phase("compute")
        return AnalysisOutcome(
            sweep=rows,
            normalizer=options.normalizer,
            shape=[B, H, L, S],
            kv_heads=Hkv,
            seed=options.seed if drawn else None,
            vanishing_threshold=options.vanishing_threshold,
            saturation_margin=ctx.saturation_margin,
            timing=timing,
        )

    return Job(flops, size, memory, run)
