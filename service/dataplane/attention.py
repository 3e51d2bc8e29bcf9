"""The attention operation: decoded arrays and options in, output, weights, scores and diagnostics out.

:func:`attention` checks the request (shapes, options, the budget), casts the tensors to the compute
dtype and returns a :class:`~service.dataplane.scheduling.Job` whose run picks the engine, computes,
and adds the diagnostics; the front ends encode the :class:`AttentionOutcome` in their wire form.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from service.core.attention import Dims, check_dims, check_params, promote_to_4d, resolved_scale
from service.core.backward import BackwardTask, gradient_health, jacobian_norms
from service.core.diagnostics import attention_diagnostics
from service.core.diagnostics.inspection import DEFAULT_SINK_POSITIONS, inspect, norm_weights
from service.core.types import AttentionInputs, AttentionParams, AttentionResult, AttentionTask
from service.dataplane import budget
from service.dataplane.context import Context
from service.dataplane.errors import invalid, too_large
from service.dataplane.memory import MemoryLease
from service.dataplane.options import AttentionOptionsLike
from service.dataplane.scheduling import Job
from service.dataplane.tensors import finite_as, float_mask_as
from service.dataplane.timing import Timing
from service.engines.base import Engine, EngineChoice, costed
from service.engines.cost import CostModel
from service.engines.dispatch import Admit

ROW_KEYS = ("entropy", "normalized_entropy", "max_weight", "argmax", "effective_support", "zeros", "attention_distance")
"""Diagnostics with one value per query row."""
TIMING_ORDER = ("decode", "compute", "encode", "diagnostics")
"""The phases of ``timing_ms``, in the order the answers list them."""


class Estimate(Protocol):
    """(flops, response bytes) of a request, priced by a cost model (the forward's or the backward's estimate)."""

    def __call__(
        self,
        dims: Dims,
        normalizer: str,
        returned: Collection[str],
        precision: str,
        encoding: str,
        alpha: float | None = None,
        *,
        costs: CostModel | None = None,
    ) -> tuple[float, int]: ...


Memory = Callable[[Dims, Collection[str], str, int], int]


@dataclass(slots=True)
class AttentionOutcome:
    """The answer of one attention request: the arrays asked for, the diagnostics, the engine that ran."""

    output: np.ndarray
    weights: np.ndarray | None
    scores: np.ndarray | None
    diagnostics: dict[str, Any] | None
    gradient_health: dict[str, Any] | None
    engine: EngineChoice
    timing: Timing
    inspection: dict[str, Any] | None = None
    norm_weights: np.ndarray | None = None


@dataclass(frozen=True, slots=True)
class InspectionRequest:
    """What the per-head inspection reads beside the tensors (docs/concepts/diagnostics.md, "Inspection")."""

    sink_positions: int = DEFAULT_SINK_POSITIONS
    token_ids: np.ndarray | None = None
    """``(B, S)`` integers (``(S,)`` for one sequence): the head pattern scores, with ``L == S``."""
    exclude_bos: bool = False
    exclude_current_token: bool = False


NO_INSPECTION = InspectionRequest()
INSPECTED = frozenset({"inspection", "norm_weights"})
"""The results the inspection adds (both need the weights)."""
NEED_WEIGHTS = frozenset({"weights", "diagnostics", "gradient_health"}) | INSPECTED
"""The results computed from the weights: an engine that returns output only is asked for them."""


def check_token_ids(token_ids: np.ndarray, dims: Dims, loc: str = "token_ids") -> np.ndarray:
    """``(B, S)`` int64 token ids for a square pattern (``L == S``), or an ``INVALID`` error naming ``loc``."""
    ids = np.asarray(token_ids)
    if ids.dtype.kind not in "iu":
        raise invalid(f"{loc} must be integers, got {ids.dtype}", loc)
    if ids.ndim == 1:
        ids = ids.reshape(1, -1)
    if ids.ndim != 2 or ids.shape != (dims.B, dims.S):
        raise invalid(f"{loc} must have shape [B, S] = [{dims.B}, {dims.S}], got {list(np.shape(token_ids))}", loc)
    if dims.L != dims.S:
        raise invalid(
            f"{loc}: the head pattern scores compare each query position with the keys (L == S); this request has "
            f"L = {dims.L} and S = {dims.S}",
            loc,
        )
    return ids.astype(np.int64, copy=False)


def check_alpha(normalizer: str, alpha: float | None) -> None:
    """``alpha`` belongs to ``entmax`` only; elsewhere it is a mistake worth saying."""
    if alpha is not None and normalizer != "entmax":
        raise invalid("alpha is only used with normalizer 'entmax'", "alpha")


@dataclass(frozen=True, slots=True)
class Checked:
    """An attention request checked and cast: the engine task and its estimates."""

    task: AttentionTask
    dims: Dims
    flops: float
    response_bytes: int


def checked_task(
    ctx: Context,
    inputs: AttentionInputs,
    options: AttentionOptionsLike,
    *,
    precision: str,
    returned: Collection[str],
    encoding: str,
    estimate: Estimate = budget.attention_estimate,
    memory: Memory | None = None,
) -> Checked:
    """Check the tensors (shapes, finiteness, the cast to ``precision``) and the options, refuse a request
    over the budget (``TOO_LARGE``), and build the engine task.

    ``estimate`` gives the request's (flops, response bytes): the forward's by default. ``memory`` gives its
    peak bytes, checked here; without it (the forward), the engine's own estimate is checked and reserved
    when the dispatcher picks an engine (:func:`engine_admission`).
    """
    dims = check_dims(inputs.query.shape, inputs.key.shape, inputs.value.shape)
    params = AttentionParams(
        normalizer=options.normalizer,
        alpha=options.alpha,
        scale=options.scale,
        temperature=options.temperature,
        causal=options.causal_alignment,
    )
    check_alpha(options.normalizer, options.alpha)
    check_params(params)
    flops, size = estimate(dims, options.normalizer, returned, precision, encoding, options.alpha, costs=ctx.costs)
    reason = budget.check(ctx.budget, flops, size, None if memory is None else memory(dims, returned, precision, size))
    if reason is not None:
        raise too_large(reason)
    dtype = np.dtype(precision)
    key_lengths = inputs.key_lengths
    task = AttentionTask(
        inputs=AttentionInputs(
            query=finite_as(inputs.query, dtype, "query"),
            key=finite_as(inputs.key, dtype, "key"),
            value=finite_as(inputs.value, dtype, "value"),
            mask=float_mask_as(inputs.mask, dtype),
            key_lengths=None if key_lengths is None else np.asarray(key_lengths, dtype=np.int64),
        ),
        params=params,
        dtype=dtype,
        need_weights=not NEED_WEIGHTS.isdisjoint(returned),
        # relu's Jacobian depends on the scores, not on the weights alone
        need_scores="scores" in returned
        or "diagnostics" in returned
        or ("gradient_health" in returned and options.normalizer == "relu"),
    )
    return Checked(task, dims, flops, size)


def engine_admission(
    ctx: Context,
    dims: Dims,
    returned: Collection[str],
    precision: str,
    encoding: str,
    lease: MemoryLease,
    *,
    cached_keys: bool = False,
) -> Admit:
    """The dispatcher's check of each candidate engine: its own work and memory estimates against the
    limits (a reason when over), and, when it fits, its memory reserved on the request's lease
    (``cached_keys``: the keys and values are a session's cache, already held on its share).
    """
    response = budget.attention_response_bytes(dims, returned, precision, encoding)

    def admit(engine: Engine, task: AttentionTask | BackwardTask) -> str | None:
        cost = engine.cost(task) if costed(engine) and isinstance(task, AttentionTask) else None
        if cost is None:
            return None
        memory = budget.attention_memory(cost, dims, precision, response, cached_keys=cached_keys)
        reason = budget.check(ctx.budget, cost.work_flops, response, memory)
        if reason is None:
            lease.reserve(memory)
        return reason

    return admit


def gradient_health_report(task: AttentionTask, result: AttentionResult, threshold: float) -> dict[str, Any]:
    """``{"threshold", "heads": [...]}``: per head, the normalizer's mean Jacobian norm and the vanishing fraction."""
    assert result.weights is not None
    B, Hq, L = result.valid_keys.shape
    weights = result.weights.reshape(B, Hq, L, -1)
    scores = None if result.scores is None else result.scores.reshape(B, Hq, L, -1)
    norms = jacobian_norms(task.params.normalizer, weights, z=scores, alpha=task.params.alpha)
    health = gradient_health(norms, result.valid_keys, threshold)
    return {"threshold": threshold, "heads": health.heads()}


def attention(
    ctx: Context,
    inputs: AttentionInputs,
    options: AttentionOptionsLike,
    *,
    precision: str,
    returned: Collection[str],
    encoding: str,
    timing: Timing,
    inspection: InspectionRequest = NO_INSPECTION,
) -> Job[AttentionOutcome]:
    """One attention request (``returned``: a subset of output, weights, scores, diagnostics,
    gradient_health, inspection, norm_weights; ``encoding`` prices the answer). ``timing`` started when the
    request's decoding did; ``inspection``: what the per-head inspection reads beside the tensors.
    """
    returned = frozenset(returned)
    checked = checked_task(ctx, inputs, options, precision=precision, returned=returned, encoding=encoding)
    task, dims = checked.task, checked.dims
    token_ids = None
    if inspection.token_ids is not None:
        if "inspection" not in returned:
            raise invalid(
                "token_ids are read by the inspection: add 'inspection' to what the request returns", "token_ids"
            )
        token_ids = check_token_ids(inspection.token_ids, dims)
    timing.phase("decode")

    def run(lease: MemoryLease) -> AttentionOutcome:
        timing.skip()  # a wait for a worker thread, if any
        admit = engine_admission(ctx, dims, returned, precision, encoding, lease)
        result, choice = ctx.run_engine("attention", task, options.engine, admit)
        assert isinstance(result, AttentionResult)
        timing.phase("compute")
        diagnostics = None
        if "diagnostics" in returned:
            diagnostics = row_diagnostics(ctx, task, result)
        health = None
        if "gradient_health" in returned:
            health = gradient_health_report(task, result, ctx.vanishing_threshold)
        inspected, normed = None, None
        if INSPECTED & returned:
            inspected, normed = inspection_report(task, result, inspection, token_ids, "inspection" in returned)
        timing.phase("diagnostics")
        return AttentionOutcome(
            output=result.output,
            weights=result.weights if "weights" in returned else None,
            scores=result.scores if "scores" in returned else None,
            diagnostics=diagnostics,
            gradient_health=health,
            engine=choice,
            timing=timing,
            inspection=inspected,
            norm_weights=normed if "norm_weights" in returned else None,
        )

    return Job(checked.flops, checked.response_bytes, 0, run)


def inspection_report(
    task: AttentionTask,
    result: AttentionResult,
    request: InspectionRequest,
    token_ids: np.ndarray | None,
    heads: bool,
) -> tuple[dict[str, Any] | None, np.ndarray]:
    """The per-head inspection (when ``heads``) and the norm-based weights, in the query's rank."""
    assert result.weights is not None
    inputs, params = task.inputs, task.params
    q, k, v = promote_to_4d(inputs.query), promote_to_4d(inputs.key), promote_to_4d(inputs.value)
    B, Hq, L = result.valid_keys.shape
    weights = result.weights.reshape(B, Hq, L, -1)
    normed = norm_weights(weights, v)
    report = None
    if heads:
        found = inspect(
            weights,
            result.valid_keys,
            q,
            k,
            v,
            factor=resolved_scale(params, q.shape[-1]) / params.temperature,
            key_lengths=inputs.key_lengths,
            sink_positions=request.sink_positions,
            tokens=token_ids,
            exclude_bos=request.exclude_bos,
            exclude_current_token=request.exclude_current_token,
            normed=normed,
        )
        report = {"sink_positions": request.sink_positions, "heads": found.heads()}
    return report, normed.reshape(result.weights.shape)


def row_diagnostics(ctx: Context, task: AttentionTask, result: AttentionResult) -> dict[str, Any]:
    """The diagnostics of an attention result, each per-row value in the query's rows (its rank)."""
    assert result.weights is not None
    B, Hq, L = result.valid_keys.shape
    diag = attention_diagnostics(
        result.weights.reshape(B, Hq, L, -1),
        result.valid_keys,
        scores=None if result.scores is None else result.scores.reshape(B, Hq, L, -1),
        output=result.output,
        causal=task.params.causal,
        thresholds=ctx.thresholds,
    )
    rows = task.inputs.query.shape[:-1]
    for k in ROW_KEYS:  # (B, Hq, L) -> the query's rows: rank-2 and rank-3 queries drop the leading axes
        arr = diag.get(k)
        if isinstance(arr, np.ndarray) and (arr.shape != rows or not arr.flags.c_contiguous):
            diag[k] = np.ascontiguousarray(arr.reshape(rows))
    return diag
