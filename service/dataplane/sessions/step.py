"""One step of an attention session, as the data plane runs it, whatever the wire form it came in.

A step appends its keys and values to the sequence's cache, then answers its query rows over every position the
cache keeps, aligned ``bottom_right`` (each new query row sees every kept position before the step's and the
step's own up to itself): the same numbers as a stateless ``attention`` request over the kept positions with
``causal: bottom_right``, because it is that request, run by the same engines on the same arrays. A step that is
refused after its append (its scores overflow, an engine's limit) leaves the cache as it was.

:func:`prepare_step` checks what can be checked before the step runs (options, shapes against the live cache,
finiteness, the budgets) and returns the :class:`~service.dataplane.scheduling.Job` that runs it under the
session's lock (:meth:`~.store.SessionStore.using`).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import numpy as np

from service.core.attention import Dims, check_dims, check_params, promote_to_4d
from service.core.diagnostics.inspection import row_sink_mass
from service.core.types import AttentionInputs, AttentionParams, AttentionResult, AttentionTask
from service.dataplane import budget
from service.dataplane.attention import check_alpha, engine_admission, row_diagnostics
from service.dataplane.context import Context
from service.dataplane.errors import invalid, too_large
from service.dataplane.memory import MemoryLease
from service.dataplane.options import SessionOptions
from service.dataplane.scheduling import Job
from service.dataplane.sessions.cache import Layout, Retention
from service.dataplane.sessions.store import SequenceId, Session, SessionStore, describe
from service.dataplane.tensors import finite_as, float_mask_as
from service.dataplane.timing import Timing
from service.engines.base import EngineChoice

DEFAULT_SINKS = 4
"""Sinks kept beside a window when the start does not say (StreamingLLM keeps 4)."""
WEIGHTS_BY_DEFAULT_MAX = 1 << 16
"""A step returns its weights unasked while they have at most this many values (B * Hq * L_step * kept)."""
TIMING_ORDER = ("decode", "compute", "encode", "diagnostics")


@dataclass(frozen=True, slots=True)
class SessionStep:
    """A step as a front end decoded it: whose sequence, what it does, its tensors and options."""

    caller: str
    """The API key's fingerprint ("" without keys): sequences belong to the key that started them."""
    sequence_id: SequenceId
    start: bool
    end: bool
    query: np.ndarray | None
    key: np.ndarray | None
    value: np.ndarray | None
    mask: np.ndarray | None
    options: SessionOptions
    precision: str
    weights: bool | None
    """Return the weights: True or False as asked, None for the default (while small)."""
    diagnostics: bool
    encoding: str


@dataclass(slots=True)
class StepOutcome:
    """A step's answer: its arrays (None for an end without tensors), the cache's size, the engine that ran."""

    output: np.ndarray | None
    weights: np.ndarray | None
    diagnostics: dict[str, Any] | None
    cache_length: int
    positions_seen: int
    engine: EngineChoice | None
    restarted: bool
    timing: Timing


STEP_TENSORS = ("query", "key", "value")


def sends_tensors(present: Collection[str]) -> bool:
    """Whether a step sends its tensors (``present``: the names of the inputs it sends): query, key and value all
    together, or none (an end only). A partial set is refused naming the missing one, a mask without them naming
    ``mask`` (it would mask nothing): the rule of every wire form.
    """
    given = [name for name in STEP_TENSORS if name in present]
    if given and len(given) < len(STEP_TENSORS):
        missing = next(name for name in STEP_TENSORS if name not in present)
        raise invalid(f"a step sends query, key and value together; {missing!r} is missing", missing)
    if "mask" in present and not given:
        raise invalid("'mask' needs query, key and value in the same step", "mask")
    return bool(given)


def store_of(ctx: Context) -> SessionStore:
    """The plane's sessions, or the refusal of a server that does not serve them."""
    if ctx.sessions is None:
        raise invalid(
            "this server does not serve attention sessions: it runs several worker processes (a session's cache "
            "lives in one) or ATTN_SESSIONS=false; run one worker per replica (docs/guides/sessions.md)",
            "sequence_id",
        )
    return ctx.sessions


def layout_of(key: np.ndarray, value: np.ndarray, dtype: np.dtype) -> Layout:
    k, v = promote_to_4d(key), promote_to_4d(value)
    return Layout(dtype, batch=k.shape[0], key_heads=k.shape[1], head_size=k.shape[3], value_size=v.shape[3])


def check_layout(session: Session, layout: Layout, sequence_id: SequenceId) -> None:
    """A later step's tensors against what the sequence fixed at its start, naming the field that differs."""
    fixed = session.cache.layout
    if layout == fixed:
        return
    name = describe(sequence_id)
    for field, what, given, have in (
        ("query", "precision", layout.dtype.name, fixed.dtype.name),
        ("key", "batch size (axis 0 of rank 4)", layout.batch, fixed.batch),
        ("key", "key heads (axis 1 of rank 4)", layout.key_heads, fixed.key_heads),
        ("key", "head size (last axis)", layout.head_size, fixed.head_size),
        ("value", "value size (last axis)", layout.value_size, fixed.value_size),
    ):
        if given != have:
            raise invalid(
                f"{field}: {name}'s cache has {what} {have}, fixed at its start; this step has {given}", field
            )


def retention_of(options: SessionOptions, start: bool) -> Retention:
    if not start:
        for name in ("window", "sinks"):
            if getattr(options, name) is not None:
                raise invalid(
                    f"parameter {name!r} is set at a sequence's start (sequence_start, or /v1's \"start\"), not on a "
                    "later step"
                )
        return Retention()
    if options.window is None:
        if options.sinks is not None:
            raise invalid("parameter 'sinks' needs a 'window': without one every position is kept")
        return Retention()
    return Retention(window=options.window, sinks=DEFAULT_SINKS if options.sinks is None else options.sinks)


def prepare_step(ctx: Context, step: SessionStep, timing: Timing) -> Job[StepOutcome]:
    """Check a step (module docstring) and return its job."""
    store = store_of(ctx)
    if not step.start:  # refused before any work when the sequence is not live (its run checks again)
        live = store.peek(step.caller, step.sequence_id)
        if live is None:
            raise store.refusal(step.caller, step.sequence_id)
    else:
        live = None
    retention = retention_of(step.options, step.start)
    if step.query is None or step.key is None or step.value is None:
        if step.start or not step.end:
            raise invalid("a step needs query, key and value (only an end may come without tensors)", "query")
        return Job(0.0, 64, 0, lambda lease: _end_only(store, step, timing))
    options = step.options
    params = AttentionParams(
        normalizer=options.normalizer,
        alpha=options.alpha,
        scale=options.scale,
        temperature=options.temperature,
        causal="bottom_right",
    )
    check_alpha(options.normalizer, options.alpha)
    check_params(params)
    check_dims(step.query.shape, step.key.shape, step.value.shape)  # the step's own shapes agree (ranks 2 to 4)
    dtype = np.dtype(step.precision)
    layout = layout_of(step.key, step.value, dtype)
    if live is not None:
        check_layout(live, layout, step.sequence_id)
    appended = promote_to_4d(step.key).shape[2]
    kept = live.cache.kept_after(appended) if live is not None else sum(retention.kept(appended))
    if kept > store.max_positions:
        raise too_large(
            f"{describe(step.sequence_id)} would keep {kept} positions, above the limit of {store.max_positions} "
            "(ATTN_SESSION_MAX_POSITIONS); start it with a window (StreamingLLM's sinks plus window) to bound it"
        )
    q4 = promote_to_4d(step.query)
    dims = Dims(
        B=q4.shape[0],
        Hq=q4.shape[1],
        Hkv=layout.key_heads,
        L=q4.shape[2],
        S=max(kept, 1),
        E=q4.shape[3],
        Ev=layout.value_size,
    )
    weights = step.weights if step.weights is not None else dims.B * dims.Hq * dims.L * dims.S <= WEIGHTS_BY_DEFAULT_MAX
    returned = {"output"} | ({"weights"} if weights else set()) | ({"diagnostics"} if step.diagnostics else set())
    flops, size = budget.attention_estimate(
        dims, options.normalizer, returned, step.precision, step.encoding, options.alpha, costs=ctx.costs
    )
    reason = budget.check(ctx.budget, flops, size, None)
    if reason is not None:
        raise too_large(reason)
    query = finite_as(step.query, dtype, "query")
    key = promote_to_4d(finite_as(step.key, dtype, "key"))
    value = promote_to_4d(finite_as(step.value, dtype, "value"))
    mask = float_mask_as(step.mask, dtype)
    timing.phase("decode")
    start = (layout, retention, step.options.sink_positions) if step.start else None

    def run(lease: MemoryLease) -> StepOutcome:
        timing.skip()
        with store.using(step.caller, step.sequence_id, start=start) as (session, restarted):
            if not step.start:
                check_layout(session, layout, step.sequence_id)
            cache = session.cache
            if cache.kept_after(appended) > store.max_positions:  # a step before this one grew the cache
                raise too_large(f"{describe(step.sequence_id)} would keep more than {store.max_positions} positions")
            staged = cache.stage(key, value)
            try:
                task, n = _task(query, cache.view(), mask, params, dtype, returned)
                run_dims = Dims(dims.B, dims.Hq, dims.Hkv, dims.L, n, dims.E, dims.Ev)
                admit = engine_admission(
                    ctx, run_dims, returned, step.precision, step.encoding, lease, cached_keys=True
                )
                result, choice = ctx.run_engine("attention_session", task, options.engine, admit)
                assert isinstance(result, AttentionResult)
                timing.phase("compute")
                diagnostics = (
                    _diagnostics(ctx, task, result, cache.below(session.sink_positions)) if (step.diagnostics) else None
                )
                timing.phase("diagnostics")
            except BaseException:
                staged.rollback()
                raise
            staged.commit()
            outcome = StepOutcome(
                output=result.output,
                weights=result.weights if weights else None,
                diagnostics=diagnostics,
                cache_length=0 if step.end else cache.length,
                positions_seen=cache.seen,
                engine=choice,
                restarted=restarted,
                timing=timing,
            )
            if step.end:
                store.end(session)
            return outcome

    return Job(flops, size, 0, run)


def _task(
    query: np.ndarray,
    kept: tuple[np.ndarray, np.ndarray],
    mask: np.ndarray | None,
    params: AttentionParams,
    dtype: np.dtype,
    returned: set[str],
) -> tuple[AttentionTask, int]:
    """The stateless task of a step: its query over the kept keys and values (in the query's rank)."""
    keys, values = kept
    lead = 4 - query.ndim
    keys, values = keys.reshape(keys.shape[lead:]), values.reshape(values.shape[lead:])
    task = AttentionTask(
        inputs=AttentionInputs(query=query, key=keys, value=values, mask=mask),
        params=params,
        dtype=dtype,
        need_weights=bool({"weights", "diagnostics"} & returned),
        need_scores="diagnostics" in returned,
    )
    return task, int(keys.shape[keys.ndim - 2])


def _diagnostics(ctx: Context, task: AttentionTask, result: AttentionResult, sinks: int) -> dict[str, Any]:
    """Attention's per-row diagnostics over the whole row, and ``sink_mass``: each row's weight on the sequence's
    first ``sink_positions`` positions (the first ``sinks`` kept ones).
    """
    diagnostics = row_diagnostics(ctx, task, result)
    assert result.weights is not None
    diagnostics["sink_mass"] = row_sink_mass(result.weights, sinks).reshape(task.inputs.query.shape[:-1])
    return diagnostics


def _end_only(store: SessionStore, step: SessionStep, timing: Timing) -> StepOutcome:
    """An end without tensors: the sequence's cache freed (refused when it is not live)."""
    seen = store.end_sequence(step.caller, step.sequence_id)
    return StepOutcome(None, None, None, 0, seen, None, False, timing)
