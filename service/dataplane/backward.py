"""The backward pass of attention: the gradients of ``sum(output * grad_output) + sum(weights * grad_weights)``
with respect to query, key and value, and on request the float mask, the scale and the temperature.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

import numpy as np

from service.core.attention import Dims
from service.core.backward import BackwardResult, BackwardTask, head_importance
from service.core.types import AttentionInputs, AttentionTask
from service.dataplane import budget
from service.dataplane.attention import checked_task
from service.dataplane.context import Context
from service.dataplane.errors import invalid
from service.dataplane.memory import MemoryLease
from service.dataplane.options import AttentionOptionsLike
from service.dataplane.scheduling import Job
from service.dataplane.tensors import finite_as
from service.dataplane.timing import Timing
from service.engines.base import Engine, EngineChoice, runs_graphs
from service.engines.dispatch import Admit

TENSOR_RESULTS = ("grad_query", "grad_key", "grad_value", "grad_mask", "output", "weights")
"""The core's results that are arrays (``grad_scale`` and ``grad_temperature`` are numbers)."""
HEAD_IMPORTANCE = "head_importance"
"""``(B, H)``: :func:`service.core.backward.head_importance`, from the forward output and ``grad_output``."""
TIMING_ORDER = ("decode", "compute", "encode")


@dataclass(slots=True)
class BackwardOutcome:
    """The answer of one backward request: the core's result (what was asked for) and the engine that ran."""

    result: BackwardResult
    want: frozenset[str]
    engine: EngineChoice
    timing: Timing
    head_importance: np.ndarray | None = None


def graph_admission(
    ctx: Context,
    dims: Dims,
    returned: Collection[str],
    precision: str,
    estimate: tuple[float, int],
    lease: MemoryLease,
) -> Admit:
    """The dispatcher's check of each candidate engine. The numpy estimate was checked and reserved before
    the run; an engine that runs a whole-tensor graph (ONNX) needs more memory: checked against the limits
    here, and the difference reserved on the lease when it fits.
    """
    flops, response = estimate
    on_numpy = budget.backward_memory(dims, returned, precision, response)

    def admit(engine: Engine, task: AttentionTask | BackwardTask) -> str | None:
        graph = engine.backward_graph_for(task) if runs_graphs(engine) and isinstance(task, BackwardTask) else None
        if graph is None:
            return None
        memory = budget.backward_graph_memory(graph, dims, precision, response)
        reason = budget.check(ctx.budget, flops, response, memory)
        if reason is None and memory > on_numpy:
            lease.reserve(memory - on_numpy)
        return reason

    return admit


def backward(
    ctx: Context,
    inputs: AttentionInputs,
    grad_output: np.ndarray,
    grad_weights: np.ndarray | None,
    options: AttentionOptionsLike,
    *,
    precision: str,
    returned: Collection[str],
    encoding: str,
    timing: Timing,
    grad_mask_loc: tuple[str | int, ...] = ("return",),
) -> Job[BackwardOutcome]:
    """One backward request; ``returned`` names the results (``grad_query``, ..., ``gradient_health``).

    ``grad_mask_loc`` names where the client asked for ``grad_mask`` (for the error when there is no
    float mask to differentiate).
    """
    want = frozenset(returned)
    importance = HEAD_IMPORTANCE in want
    core_want = (want - {HEAD_IMPORTANCE}) | ({"output"} if importance else set())
    checked = checked_task(
        ctx,
        inputs,
        options,
        precision=precision,
        returned=core_want,
        encoding=encoding,
        estimate=budget.backward_estimate,
        memory=budget.backward_memory,
    )
    if "grad_mask" in want:
        mask = checked.task.inputs.mask
        if mask is None or mask.dtype == bool:
            raise invalid(
                "grad_mask is the gradient of a float (additive) mask; this request has "
                + ("no mask" if mask is None else "a boolean mask"),
                *grad_mask_loc,
            )
    dtype = np.dtype(precision)
    bt = BackwardTask(
        task=checked.task,
        grad_output=finite_as(grad_output, dtype, "grad_output"),
        grad_weights=None if grad_weights is None else finite_as(grad_weights, dtype, "grad_weights"),
        want=core_want,
        vanishing_threshold=ctx.vanishing_threshold,
    )
    dims = checked.dims
    memory = budget.backward_memory(dims, core_want, precision, checked.response_bytes)
    timing.phase("decode")

    def run(lease: MemoryLease) -> BackwardOutcome:
        timing.skip()
        admit = graph_admission(ctx, dims, core_want, precision, (checked.flops, checked.response_bytes), lease)
        result, choice = ctx.run_engine("attention_backward", bt, options.engine, admit)
        assert isinstance(result, BackwardResult)
        timing.phase("compute")
        scores = None
        if importance:
            assert result.output is not None
            scores = head_importance(result.output, bt.grad_output)
            if "output" not in want:
                result.output = None
        return BackwardOutcome(result, want, choice, timing, scores)

    return Job(checked.flops, checked.response_bytes, memory, run)
