"""The models ``attention`` and ``attention_backward``: the attention operations over the inference protocol.

The scalar options (``normalizer``, ``alpha``, ``causal``, ``scale``, ``temperature``, ``engine``) are request
parameters; diagnostics, the engine that ran and the timings come back as response parameters:
``diagnostics`` and ``timing_ms`` as JSON text, ``engine``, ``engine_provider``, ``engine_reason`` as strings.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from service.core.types import AttentionInputs
from service.dataplane import attention as attention_op
from service.dataplane import backward as backward_op
from service.dataplane.context import Context
from service.dataplane.errors import invalid
from service.dataplane.inference import InferRequest, InferResult, TensorSpec
from service.dataplane.models.base import (
    COMMON_PARAMETERS,
    FLOAT,
    FLOAT_IN,
    INDEX,
    MASK,
    Model,
    flag,
    json_text,
    option_fields,
    precision_of,
    response_encoding,
    validated,
)
from service.dataplane.options import AttentionOptions
from service.dataplane.scheduling import Job
from service.dataplane.timing import Timing
from service.engines.base import EngineChoice

ATTENTION_PARAMETERS = {
    **COMMON_PARAMETERS,
    "causal": 'false (default), true (= top_left), "top_left", "bottom_right"',
    "scale": "number > 0 (default 1/sqrt(E))",
    "engine": "string: auto (default), numpy, onnx",
}
INSPECTION_PARAMETERS = {
    "inspection": "bool (default false): the per-head inspection (JSON text) in the response parameters",
    "sink_positions": "int >= 0 (default 4): sink_mass counts keys 0 to sink_positions - 1",
    "exclude_bos": "bool (default false): the pattern scores leave the first key out",
    "exclude_current_token": "bool (default false): the pattern scores leave the diagonal out",
}
OPTION_NAMES = ("normalizer", "alpha", "temperature", "causal", "scale", "engine")
INSPECTION_NAMES = tuple(INSPECTION_PARAMETERS)


def inspection_of(request: InferRequest) -> attention_op.InspectionRequest:
    """The inspection's parameters and ``token_ids`` input, each refused naming it when malformed."""
    sink_positions = request.parameters.get("sink_positions", 4)
    if isinstance(sink_positions, bool) or not isinstance(sink_positions, int) or sink_positions < 0:
        raise invalid("parameter 'sink_positions' must be an integer >= 0", "sink_positions")
    return attention_op.InspectionRequest(
        sink_positions=sink_positions,
        token_ids=request.inputs.get("token_ids"),
        exclude_bos=flag(request, "exclude_bos", False),
        exclude_current_token=flag(request, "exclude_current_token", False),
    )


def engine_parameters(choice: EngineChoice) -> dict[str, Any]:
    return {"engine": choice.name, "engine_provider": choice.provider, "engine_reason": choice.reason}


def attention_inputs(request: InferRequest) -> AttentionInputs:
    inputs = request.inputs
    return AttentionInputs(
        query=inputs["query"],
        key=inputs["key"],
        value=inputs["value"],
        mask=inputs.get("mask"),
        key_lengths=inputs.get("key_lengths"),
    )


def _prepare_attention(ctx: Context, request: InferRequest, timing: Timing) -> Job[InferResult]:
    wanted = ATTENTION.wanted(request)
    with_diagnostics = flag(request, "diagnostics", True)
    fields = option_fields(request, ATTENTION, OPTION_NAMES + INSPECTION_NAMES)
    for name in INSPECTION_NAMES:
        fields.pop(name, None)
    options = validated(AttentionOptions, fields, ATTENTION)
    inspected = flag(request, "inspection", False)
    returned = wanted + (["diagnostics"] if with_diagnostics else []) + (["inspection"] if inspected else [])
    precision = precision_of(request, ("query", "key", "value"))
    job = attention_op.attention(
        ctx,
        attention_inputs(request),
        options,
        precision=precision,
        returned=returned,
        encoding=response_encoding(request, wanted),
        timing=timing,
        inspection=inspection_of(request),
    )

    def finish(out: attention_op.AttentionOutcome) -> InferResult:
        arrays = {"output": out.output, "weights": out.weights, "scores": out.scores, "norm_weights": out.norm_weights}
        outputs = [(name, np.ascontiguousarray(arrays[name])) for name in wanted]
        timing.phase("encode")
        params = engine_parameters(out.engine)
        if with_diagnostics and out.diagnostics is not None:
            params["diagnostics"] = json_text(out.diagnostics)
        if out.inspection is not None:
            params["inspection"] = json_text(out.inspection)
        params["timing_ms"] = json_text(timing.ms(attention_op.TIMING_ORDER))
        return InferResult(outputs, params)

    return job.then(finish)


ATTENTION = Model(
    name="attention",
    description=(
        "Scaled dot-product attention: scores = scale * Q K^T, plus the mask bias, divided by the "
        "temperature, normalized over the keys, output = A V. query (B, Hq, L, E), key (B, Hkv, S, E), value "
        "(B, Hkv, S, Ev); ranks 2 and 3 mean leading axes of size 1. FP64 inputs compute in float64, FP32 and "
        "FP16 in float32 (outputs FP32)."
    ),
    inputs=(
        TensorSpec("query", FLOAT_IN, description="(B, Hq, L, E), (H, L, E) or (L, E)"),
        TensorSpec("key", FLOAT_IN, description="(B, Hkv, S, E) with Hq % Hkv == 0; the query's precision"),
        TensorSpec("value", FLOAT_IN, description="(B, Hkv, S, Ev); the query's precision"),
        TensorSpec(
            "mask",
            MASK,
            min_rank=1,
            optional=True,
            description="BOOL (true = may attend) or additive float, broadcastable to (B, Hq, L, S)",
        ),
        TensorSpec(
            "key_lengths",
            INDEX,
            min_rank=1,
            max_rank=1,
            optional=True,
            description="(B,): key j of batch b is valid iff j < key_lengths[b]",
        ),
        TensorSpec(
            "token_ids",
            INDEX,
            min_rank=1,
            max_rank=2,
            optional=True,
            description="(B, S) or (S,), with inspection and L == S: the head pattern scores",
        ),
    ),
    outputs=(
        TensorSpec("output", FLOAT, description="the query's shape with Ev last"),
        TensorSpec("weights", FLOAT, description="query.shape[:-1] + (S,)"),
        TensorSpec(
            "scores", FLOAT, description="normalizer input (scale*QK^T + bias)/T, masked = -inf; only when requested"
        ),
        TensorSpec("norm_weights", FLOAT, description="||A_ij v_j||, the weights' shape; only when requested"),
    ),
    default_outputs=("output", "weights"),
    parameters={**ATTENTION_PARAMETERS, **INSPECTION_PARAMETERS},
    prepare=_prepare_attention,
)


BACKWARD_PARAMETERS = {
    **{k: v for k, v in ATTENTION_PARAMETERS.items() if k != "diagnostics"},
    "grad_scale": "bool (default false): return the derivative with respect to the scale in the response parameters",
    "grad_temperature": "bool (default false): return the derivative with respect to the temperature likewise",
    "gradient_health": "bool (default false): return the per-head gradient health (JSON text) likewise",
}
BACKWARD_FLAGS = ("grad_scale", "grad_temperature", "gradient_health")


def _prepare_backward(ctx: Context, request: InferRequest, timing: Timing) -> Job[InferResult]:
    wanted = ATTENTION_BACKWARD.wanted(request)
    flags = [name for name in BACKWARD_FLAGS if flag(request, name, False)]
    fields = option_fields(request, ATTENTION_BACKWARD, OPTION_NAMES + BACKWARD_FLAGS)
    for name in BACKWARD_FLAGS:
        fields.pop(name, None)
    inputs = request.inputs
    floats = ("query", "key", "value", "grad_output") + (("grad_weights",) if "grad_weights" in inputs else ())
    precision = precision_of(request, floats)
    options = validated(AttentionOptions, fields, ATTENTION_BACKWARD)
    job = backward_op.backward(
        ctx,
        attention_inputs(request),
        inputs["grad_output"],
        inputs.get("grad_weights"),
        options,
        precision=precision,
        returned=wanted + flags,
        encoding=response_encoding(request, wanted),
        timing=timing,
        grad_mask_loc=("outputs",),
    )

    def finish(out: backward_op.BackwardOutcome) -> InferResult:
        result = out.result
        outputs = []
        for name in wanted:
            arr = out.head_importance if name == backward_op.HEAD_IMPORTANCE else getattr(result, name)
            assert arr is not None
            outputs.append((name, np.ascontiguousarray(arr)))
        timing.phase("encode")
        params = engine_parameters(out.engine)
        params["timing_ms"] = json_text(timing.ms(backward_op.TIMING_ORDER))
        for name in ("grad_scale", "grad_temperature"):
            if name in out.want:
                params[name] = getattr(result, name)
        if "gradient_health" in out.want and result.gradient_health is not None:
            health = result.gradient_health
            params["gradient_health"] = json_text({"threshold": health.threshold, "heads": health.heads()})
        return InferResult(outputs, params)

    return job.then(finish)


ATTENTION_BACKWARD = Model(
    name="attention_backward",
    description=(
        "The backward pass of model attention: the gradients of sum(output * grad_output) + "
        "sum(weights * grad_weights) with respect to query, key and value (key and value summed over the query "
        "heads sharing them), and on request of a float mask. Same inputs and parameters as attention, plus "
        "grad_output; FP64 inputs compute in float64."
    ),
    inputs=(
        *(spec for spec in ATTENTION.inputs if spec.name != "token_ids"),  # read by the forward inspection only
        TensorSpec("grad_output", FLOAT_IN, description="the output's shape: query.shape[:-1] + (Ev,)"),
        TensorSpec(
            "grad_weights", FLOAT_IN, optional=True, description="the weights' shape: query.shape[:-1] + (S,); optional"
        ),
    ),
    outputs=(
        TensorSpec("grad_query", FLOAT, description="the query's shape"),
        TensorSpec("grad_key", FLOAT, description="the key's shape"),
        TensorSpec("grad_value", FLOAT, description="the value's shape"),
        TensorSpec("grad_mask", FLOAT, min_rank=1, description="a float mask's shape; only when requested"),
        TensorSpec("output", FLOAT, description="the forward output; only when requested"),
        TensorSpec("weights", FLOAT, description="the forward weights; only when requested"),
        TensorSpec(
            "head_importance",
            FLOAT,
            min_rank=2,
            max_rank=2,
            description="(B, H): |sum of grad_output * output| per batch entry and query head; only when requested",
        ),
    ),
    default_outputs=("grad_query", "grad_key", "grad_value"),
    parameters=BACKWARD_PARAMETERS,
    prepare=_prepare_backward,
)
