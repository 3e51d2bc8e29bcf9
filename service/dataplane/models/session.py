"""The model ``attention_session``: attention with a server-side key/value cache per sequence, driven by the
protocol's sequence extension (Triton's request parameters ``sequence_id``, ``sequence_start``, ``sequence_end``).

The stateless models refuse those parameters (:func:`~.base.option_fields`): a Triton client that believes it holds
a sequence there would otherwise get answers computed without its cache.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from service.dataplane.context import Context
from service.dataplane.errors import invalid
from service.dataplane.inference import InferRequest, InferResult, TensorSpec
from service.dataplane.models.base import (
    COMMON_PARAMETERS,
    FLOAT,
    FLOAT_IN,
    MASK,
    SESSION_MODEL,
    Model,
    flag,
    json_text,
    option_fields,
    precision_of,
    response_encoding,
    sequence_of,
    validated,
)
from service.dataplane.options import SessionOptions
from service.dataplane.scheduling import Job
from service.dataplane.sessions.step import TIMING_ORDER, SessionStep, StepOutcome, prepare_step, sends_tensors
from service.dataplane.timing import Timing

SESSION_PARAMETERS = {
    "sequence_id": 'uint64 > 0, or a non-empty string (<= 256 characters): the sequence (0 or "" is refused)',
    "sequence_start": "bool: this step starts the sequence (a live one of the same id is restarted)",
    "sequence_end": "bool: the sequence ends after this step (a step without tensors just ends it)",
    **{k: v for k, v in COMMON_PARAMETERS.items()},
    "scale": "number > 0 (default 1/sqrt(E))",
    "engine": "string: auto (default), numpy, onnx",
    "window": "int >= 1, at the start: keep the last `window` positions besides the sinks (default: keep all)",
    "sinks": "int >= 0, at the start with a window: the first positions always kept (default 4)",
    "sink_positions": "int >= 0 (default 4): sink_mass is the weight on the sequence's first sink_positions positions",
}
OPTION_NAMES = ("normalizer", "alpha", "temperature", "scale", "engine", "window", "sinks", "sink_positions")


def _prepare_step(ctx: Context, request: InferRequest, timing: Timing) -> Job[InferResult]:
    sequence_id, start, end = sequence_of(request)
    if sequence_id is None:
        raise invalid(
            f"model {SESSION_MODEL!r} needs a sequence: parameter 'sequence_id' (a non-zero integer or a non-empty "
            'string; 0 and "" mean no sequence in the protocol)',
            "sequence_id",
        )
    options = validated(SessionOptions, option_fields(request, ATTENTION_SESSION, OPTION_NAMES), ATTENTION_SESSION)
    inputs = request.inputs
    given = sends_tensors(inputs)
    wanted = ATTENTION_SESSION.wanted(request)
    with_diagnostics = flag(request, "diagnostics", True)
    step = SessionStep(
        caller=request.caller,
        sequence_id=sequence_id,
        start=start,
        end=end,
        query=inputs.get("query"),
        key=inputs.get("key"),
        value=inputs.get("value"),
        mask=inputs.get("mask"),
        options=options,
        precision=precision_of(request, ("query", "key", "value")) if given else "float32",
        weights=("weights" in request.outputs) if request.outputs_given else None,
        diagnostics=with_diagnostics and bool(given),
        encoding=response_encoding(request, [n for n in wanted if n in ("output", "weights")]),
    )
    query_rows = step.query.shape[:-1] if step.query is not None else ()

    def finish(out: StepOutcome) -> InferResult:
        arrays: dict[str, np.ndarray | None] = {
            "output": out.output,
            "weights": out.weights,
            "cache_length": np.array([out.cache_length], dtype=np.int64),
            "positions_seen": np.array([out.positions_seen], dtype=np.int64),
        }
        names = wanted if request.outputs_given else [n for n in wanted if arrays[n] is not None]
        outputs = []
        for name in names:
            arr = arrays[name]
            if arr is None:
                continue  # an end without tensors has no output or weights
            if name == "output":
                arr = arr.reshape(query_rows + arr.shape[-1:])
            outputs.append((name, np.ascontiguousarray(arr)))
        timing.phase("encode")
        params: dict[str, Any] = {}
        if out.engine is not None:
            params.update(engine=out.engine.name, engine_provider=out.engine.provider, engine_reason=out.engine.reason)
        if out.restarted:
            params["sequence_restarted"] = True
        if out.diagnostics is not None:
            params["diagnostics"] = json_text(out.diagnostics)
        params["timing_ms"] = json_text(timing.ms(TIMING_ORDER))
        return InferResult(outputs, params)

    return prepare_step(ctx, step, timing).then(finish)


ATTENTION_SESSION = Model(
    name=SESSION_MODEL,
    description=(
        "Attention over a server-side key/value cache per sequence (sequence_id, sequence_start, sequence_end): "
        "each step appends its key and value positions, and its query rows attend over every position the cache "
        "keeps, aligned bottom_right (the same numbers as model attention over those positions with causal "
        "bottom_right). The cache's precision, batch, key heads, head size and value size are fixed at the start. "
        "docs/guides/sessions.md"
    ),
    inputs=(
        TensorSpec("query", FLOAT_IN, optional=True, description="(B, Hq, L_step, E), (Hq, L_step, E) or (L_step, E)"),
        TensorSpec("key", FLOAT_IN, optional=True, description="(B, Hkv, S_step, E): the positions appended"),
        TensorSpec("value", FLOAT_IN, optional=True, description="(B, Hkv, S_step, Ev)"),
        TensorSpec(
            "mask",
            MASK,
            min_rank=1,
            optional=True,
            description="BOOL or additive float, broadcastable to (B, Hq, L_step, cache_length after the append)",
        ),
    ),
    outputs=(
        TensorSpec("output", FLOAT, description="the query's shape with Ev last"),
        TensorSpec(
            "weights",
            FLOAT,
            description="query.shape[:-1] + (cache_length,); returned unasked while at most 65,536 values",
        ),
        TensorSpec("cache_length", ("INT64",), min_rank=1, max_rank=1, description="(1,): positions kept"),
        TensorSpec("positions_seen", ("INT64",), min_rank=1, max_rank=1, description="(1,): positions appended"),
    ),
    default_outputs=("output", "weights", "cache_length", "positions_seen"),
    parameters=SESSION_PARAMETERS,
    prepare=_prepare_step,
    stateful=True,
)
