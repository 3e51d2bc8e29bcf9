"""The rollout operation: attention rollout across layers (:mod:`service.core.rollout`), checked, priced and run.

The input is a stack ``[layers, B, H, L, L]`` of the layers' weights, first layer first (and, for the
gradient-weighted form, the gradients of the same shape); the answer is ``[B, L, L]``, or ``[B, R, L]`` for the
``R`` rows asked for, and with ``top_k`` each answered row's ``k`` largest entries and their key indices
(``[B, R, k]`` each) instead of, or (on ``/v2``, when the outputs list both) beside, the whole rows. Each layer
``[B, H, L, L]`` is held to ``ATTN_MAX_TENSOR_ELEMENTS`` (a weights tensor that ``/v1/attention`` could answer),
the layers to ``ATTN_MAX_DIM``. The work is priced like the rest
(:mod:`.budget`): float64 products, ``L^3`` per layer and batch entry for the whole answer, ``R * L^2`` for ``R``
rows, plus the passes over the stack; a request over a limit is refused (``TOO_LARGE``) with a message that names
``rows`` and ``top_k`` where the whole ``L x L`` answer is what is too large. Nothing is ever substituted.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Annotated, Literal, Protocol

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt

from service.core import rollout as core
from service.dataplane import budget
from service.dataplane.context import Context
from service.dataplane.errors import invalid, too_large
from service.dataplane.memory import MemoryLease
from service.dataplane.scheduling import Job
from service.dataplane.tensors import STACK_RANK
from service.dataplane.timing import Timing
from service.engines import cost
from service.engines.base import pooled

TIMING_ORDER = ("decode", "compute", "encode")
STACK_SHAPE = "[layers, B, H, L, L]"

HeadFusion = Literal["mean", "max", "min"]
Fraction = Annotated[float, Field(strict=True, ge=0, le=1, allow_inf_nan=False)]

CHECK_NS_PER_WEIGHT = 2.5
"""Each weight's checks (minimum, row sums) and its share of the head fusion, read once from memory."""
GRADIENT_NS_PER_WEIGHT = 4.0
"""With gradients: their finiteness (minimum, maximum), the product with the weight, its positive part."""
RENORMALIZE_NS_PER_WEIGHT = 2.0
"""With ``renormalize``: each row's float64 sum and the scaled float64 copy of the head."""
MATRIX_NS_PER_ENTRY = 3.0
"""Each fused entry: the residual, the row renormalisation."""
DISCARD_NS_PER_ENTRY = 12.0
"""With ``discard_ratio``: the partition of each fused matrix and the comparisons."""
TOP_NS_PER_ENTRY = 40.0
"""With ``top_k``: the stable sort of each answered row (about ``log2(L)`` comparisons an entry)."""


class RolloutOptionsLike(Protocol):
    """The scalar options of a rollout (the /v1 body's fields, the /v2 parameters)."""

    @property
    def head_fusion(self) -> str: ...
    @property
    def residual(self) -> float: ...
    @property
    def discard_ratio(self) -> float: ...
    @property
    def renormalize(self) -> bool: ...
    @property
    def top_k(self) -> int | None: ...


class RolloutOptions(BaseModel):
    """The scalar options of a rollout, alone (the request parameters of the model ``attention_rollout``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    head_fusion: HeadFusion = "mean"
    residual: Fraction = 0.5
    discard_ratio: Fraction = 0.0
    renormalize: StrictBool = False
    top_k: Annotated[StrictInt, Field(ge=1)] | None = None


@dataclass(frozen=True, slots=True)
class StackDims:
    """The sizes of a stack ``[layers, B, H, L, L]``."""

    layers: int
    B: int
    H: int
    L: int

    @property
    def weights(self) -> int:
        return self.layers * self.B * self.H * self.L * self.L


@dataclass(slots=True)
class RolloutOutcome:
    rollout: np.ndarray | None
    """``[B, L, L]``, or ``[B, R, L]`` for the rows asked for, in the request's precision (None when not asked)."""
    timing: Timing
    top_keys: np.ndarray | None = None
    """With ``top_k``: ``[B, R, k]`` int64, the key indices of each row's ``k`` largest entries, largest first."""
    top_values: np.ndarray | None = None
    """With ``top_k``: ``[B, R, k]``, those entries, in the request's precision."""


def stack_dims(weights: np.ndarray, gradients: np.ndarray | None, max_elements: int) -> StackDims:
    """The stack's sizes; refused (naming the field) unless it is ``[layers, B, H, L, L]`` with each layer within
    ``max_elements`` and the gradients, when given, of the same shape.
    """
    shape = weights.shape
    if len(shape) != STACK_RANK:
        raise invalid(
            f"weights has rank {len(shape)}; it must have rank 5: {STACK_SHAPE}, the layers' attention weights, "
            "first layer first",
            "weights",
            "shape",
        )
    layers, batch, heads, rows, keys = shape
    if rows != keys:
        raise invalid(
            f"weights has shape {list(shape)}: its last two axes must be equal ({STACK_SHAPE}, each layer's "
            "attention over one sequence)",
            "weights",
            "shape",
            4,
        )
    per_layer = batch * heads * rows * keys
    if per_layer > max_elements:
        raise invalid(
            f"weights has {per_layer} elements per layer ([B, H, L, L] = {list(shape[1:])}), above the limit of "
            f"{max_elements}",
            "weights",
            "shape",
        )
    if gradients is not None and gradients.shape != shape:
        raise invalid(
            f"gradients has shape {list(gradients.shape)}; it must have the weights' shape {list(shape)}",
            "gradients",
            "shape",
        )
    return StackDims(layers, batch, heads, rows)


def estimate(
    d: StackDims,
    rows: int | None,
    options: RolloutOptionsLike,
    with_gradients: bool,
    precision: str,
    encoding: str,
    *,
    whole: bool = True,
    workers: int = 1,
    costs: cost.CostModel | None = None,
) -> tuple[float, int, int]:
    """(flops, response bytes, memory bytes) of one rollout; ``whole``: the answer's rows are returned, not only
    their ``options.top_k`` largest entries.

    Work: the float64 products (at half the float32 GEMM rate, so counted twice), ``2 * R * L^2`` per layer after
    the last and batch entry with ``R = rows`` or ``L``, plus the passes over the weights and the fused matrices.
    Memory: the stack as decoded (at most float64) and the gradients, the fused matrices of every layer (float64
    ``[layers, B, L, L]``), one head's float64 temporaries per worker thread, two product blocks of the answer's
    size, the answer in its precision and the response.
    """
    out_rows = d.L if rows is None else rows
    gemm = 2.0 * max(d.layers - 1, 0) * d.B * out_rows * d.L * d.L
    per_weight = (
        CHECK_NS_PER_WEIGHT + with_gradients * GRADIENT_NS_PER_WEIGHT + options.renormalize * RENORMALIZE_NS_PER_WEIGHT
    )
    entries = d.layers * d.B * d.L * d.L
    per_entry = MATRIX_NS_PER_ENTRY + (options.discard_ratio > 0) * DISCARD_NS_PER_ENTRY
    factor = budget.operations_costs(costs).factor("gemm")
    flops = 2.0 * gemm * factor + budget.ns_as_flops(d.weights * per_weight + entries * per_entry)
    answer = d.B * out_rows * d.L
    per_number = budget.bytes_per_number(precision, encoding)
    returned = answer * per_number if whole or options.top_k is None else 0.0
    if options.top_k is not None:  # the values and their int64 indices (priced as float64 numbers), a sort's scratch
        top = d.B * out_rows * options.top_k
        returned += top * (per_number + budget.bytes_per_number("float64", encoding))
        flops += budget.ns_as_flops(answer * TOP_NS_PER_ENTRY)
    response = int(returned + 4096)
    head_scratch = d.L * d.L * 8 * (1 + with_gradients + options.renormalize) * max(1, workers)
    itemsize = 4 if precision == "float32" else 8
    sort_scratch = answer * 16 if options.top_k is not None else 0  # the negated rows and the order
    memory = (
        d.weights * 8 * (1 + with_gradients)
        + entries * 8
        + head_scratch
        + answer * (16 + itemsize)
        + sort_scratch
        + response
    )
    return flops, response, memory


def refuse_over_budget(
    ctx: Context, flops: float, response: int, memory: int, rows: int | None, *, whole: bool = True
) -> None:
    """``TOO_LARGE`` when the rollout is over a limit; the message names ``rows`` (the work and the size) and
    ``top_k`` (the size) where the whole ``[B, L, L]`` answer is what is too large, and what helps otherwise.
    """
    limits = ctx.budget
    all_rows = rows is None
    work_hint = (
        "; the whole [B, L, L] rollout is what is too large: send rows (e.g. [0], the first token's row, or [-1], "
        "the last one) to have only those rows, [B, R, L], at R * L^2 work per layer instead of L^3"
    )
    size_hint = (
        "; the whole rows of the rollout are what is too large: send top_k to have only each row's k largest "
        "entries and their key indices, [B, R, k], or rows to have only those rows, [B, R, L]"
    )
    if flops > limits.max_work_flops:
        raise too_large(
            f"estimated work {flops:.3g} GEMM-equivalent floating-point operations (about "
            f"{flops / cost.REFERENCE_GEMM_FLOPS_PER_S:.2g} core-seconds) exceeds the limit of "
            f"{limits.max_work_flops:.3g}" + (work_hint if all_rows else "; send fewer rows, layers or batch entries")
        )
    if response > limits.max_response_bytes:
        if not whole:
            helps = "; send a smaller top_k, fewer rows or batch entries"
        elif all_rows:
            helps = size_hint
        else:
            helps = "; send top_k to have only each row's k largest entries and their key indices, fewer rows or "
            helps += "batch entries"
        raise too_large(
            f"estimated response size {response} bytes exceeds the limit of {limits.max_response_bytes}"
            + helps
            + ", or take the answer in a binary form"
        )
    reason = budget.check(limits, 0.0, 0, memory)
    if reason is not None:
        raise too_large(reason)


def floats(arr: np.ndarray) -> np.ndarray:
    """``arr`` as floats: JSON lists of integers (``[1, 0, 0]``) decode as int64 and count as float64."""
    return arr if arr.dtype.kind == "f" else arr.astype(np.float64)


def worker_pool(ctx: Context) -> tuple[Executor | None, int]:
    """The numpy engine's worker threads, which the rollout's layers and row blocks share (none before it starts)."""
    engine = ctx.dispatcher.engines.get("numpy")
    return engine.worker_pool() if engine is not None and pooled(engine) else (None, 1)


def rollout(
    ctx: Context,
    weights: np.ndarray,
    gradients: np.ndarray | None,
    rows: Sequence[int] | np.ndarray | None,
    options: RolloutOptionsLike,
    *,
    sent_as: np.dtype,
    precision: str,
    encoding: str,
    timing: Timing,
    whole: bool = True,
) -> Job[RolloutOutcome]:
    """The rollout of ``weights`` ``[layers, B, H, L, L]`` (:mod:`service.core.rollout`), computed in float64 and
    answered in ``precision``: the whole rows when ``whole`` (it must be, without ``options.top_k``), and with
    ``top_k`` each row's largest entries and their key indices. ``sent_as``: the dtype the weights came in on the
    wire (float64 for JSON lists), which with the precision sets the row sums' tolerance
    (:func:`service.core.rollout.row_sum_tolerance`).
    """
    d = stack_dims(weights, gradients, ctx.limits.max_elements)
    weights, gradients = floats(weights), None if gradients is None else floats(gradients)
    sent_as = sent_as if sent_as.kind == "f" else np.dtype(np.float64)  # integers in JSON lists: float64 numbers
    dtype = np.dtype(precision)
    params = core.RolloutParams(
        head_fusion=options.head_fusion,
        residual=options.residual,
        discard_ratio=options.discard_ratio,
        renormalize=options.renormalize,
        tolerance=core.row_sum_tolerance(sent_as, dtype),
    )
    core.check_params(params, gradients is not None)
    top_k = options.top_k
    if top_k is not None:
        core.check_top_k(top_k, d.L)
    elif not whole:
        raise invalid("the top keys of the rollout are asked for without top_k: send top_k", "top_k")
    picked = None if rows is None else core.resolve_rows(rows, d.L)
    executor, workers = worker_pool(ctx)
    count = None if picked is None else len(picked)
    flops, response, memory = estimate(
        d, count, options, gradients is not None, precision, encoding, whole=whole, workers=workers, costs=ctx.costs
    )
    refuse_over_budget(ctx, flops, response, memory, count, whole=whole)
    timing.phase("decode")

    def run(lease: MemoryLease) -> RolloutOutcome:
        timing.skip()
        result = core.rollout(weights, gradients, params, picked, executor=executor, workers=workers)
        out = RolloutOutcome(result.astype(dtype, copy=False) if whole else None, timing)
        if top_k is not None:
            keys, values = core.top_keys(result, top_k)
            out.top_keys, out.top_values = keys, values.astype(dtype, copy=False)
        timing.phase("compute")
        return out

    return Job(flops, response, memory, run)
