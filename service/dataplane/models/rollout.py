"""The model ``attention_rollout``: attention rollout across layers (:mod:`service.dataplane.rollout`) over the
inference protocol.

Inputs ``weights`` (and optionally ``gradients``) ``[layers, B, H, L, L]`` as FP16, FP32 or FP64 (FP64 computes and
answers in float64, the others answer FP32), and an optional ``rows`` vector (INT64 or INT32); the options are
request parameters; the output ``rollout`` is ``[B, L, L]`` or ``[B, R, L]``. The timings come back in the response
parameters.
"""

from __future__ import annotations

import numpy as np

from service.dataplane import rollout as rollout_op
from service.dataplane.context import Context
from service.dataplane.errors import invalid
from service.dataplane.inference import DATATYPES, InferRequest, InferResult, TensorSpec
from service.dataplane.models.base import (
    FLOAT,
    FLOAT_IN,
    INDEX,
    Model,
    json_text,
    option_fields,
    precision_of,
    response_encoding,
    validated,
)
from service.dataplane.scheduling import Job
from service.dataplane.timing import Timing

ROLLOUT_OPTIONS = ("head_fusion", "residual", "discard_ratio", "renormalize", "top_k")
TOP_OUTPUTS = ("top_keys", "top_values")
ROLLOUT_PARAMETERS = {
    "head_fusion": 'string: "mean" (default), "max" or "min" over the heads; with gradients only "mean"',
    "residual": "number in [0, 1] (default 0.5): A_hat = residual * I + (1 - residual) * A_fused, rows renormalised",
    "discard_ratio": "number in [0, 1] (default 0): the lowest fraction of each fused matrix set to 0, never [0, 0]",
    "renormalize": "bool (default false): divide each row of the weights by its sum instead of refusing it",
    "top_k": "integer >= 1: answer top_keys and top_values, each row's k largest entries (the default outputs then)",
    "binary_data_output": "bool (default false): return every output not listed otherwise as binary data",
}


def _prepare(ctx: Context, request: InferRequest, timing: Timing) -> Job[InferResult]:
    fields = option_fields(request, ATTENTION_ROLLOUT, ROLLOUT_OPTIONS)
    options = validated(rollout_op.RolloutOptions, fields, ATTENTION_ROLLOUT)
    inputs = request.inputs
    floats = ("weights", "gradients") if "gradients" in inputs else ("weights",)
    precision = precision_of(request, floats)
    wanted = ATTENTION_ROLLOUT.wanted(request) if request.outputs_given or options.top_k is None else list(TOP_OUTPUTS)
    if options.top_k is not None and not any(name in wanted for name in TOP_OUTPUTS):
        raise invalid("top_k asks for the outputs top_keys and top_values, which the outputs do not list", "top_k")
    job = rollout_op.rollout(
        ctx,
        inputs["weights"],
        inputs.get("gradients"),
        inputs.get("rows"),
        options,
        sent_as=DATATYPES[request.datatypes["weights"]],
        precision=precision,
        encoding=response_encoding(request, wanted),
        timing=timing,
        whole="rollout" in wanted,
    )

    def finish(out: rollout_op.RolloutOutcome) -> InferResult:
        parts = {"rollout": out.rollout, "top_keys": out.top_keys, "top_values": out.top_values}
        outputs = [(name, np.ascontiguousarray(parts[name])) for name in wanted]
        timing.phase("encode")
        return InferResult(outputs, {"timing_ms": json_text(timing.ms(rollout_op.TIMING_ORDER))})

    return job.then(finish)


ATTENTION_ROLLOUT = Model(
    name="attention_rollout",
    description=(
        "Attention rollout across layers (Abnar and Zuidema 2020): each layer's weights fused over the heads "
        "(mean, max or min; with gradients the mean of relu(grad * A), Chefer et al. 2021), the lowest "
        "discard_ratio of each fused matrix set to 0, mixed with the identity (residual) and renormalised by rows, "
        "then multiplied, last layer first. FP64 inputs compute in float64 and answer FP64; the rows input asks for "
        "only those rows of the answer, the top_k parameter for only each row's k largest entries (top_keys, "
        "top_values)."
    ),
    inputs=(
        TensorSpec(
            "weights",
            FLOAT_IN,
            min_rank=5,
            max_rank=5,
            description="[layers, B, H, L, L], first layer first; rows sum to 1 (or 0: fully masked)",
        ),
        TensorSpec(
            "gradients",
            FLOAT_IN,
            min_rank=5,
            max_rank=5,
            optional=True,
            description="the weights' shape: the gradient-weighted form (Chefer et al. 2021)",
        ),
        TensorSpec(
            "rows",
            INDEX,
            min_rank=1,
            max_rank=1,
            optional=True,
            description="(R,): the rows of the answer to compute, negative from the end, none twice",
        ),
    ),
    outputs=(
        TensorSpec("rollout", FLOAT, min_rank=3, max_rank=3, description="[B, L, L], or [B, R, L] with rows"),
        TensorSpec(
            "top_keys",
            ("INT64",),
            min_rank=3,
            max_rank=3,
            description="[B, R, k] with top_k: the key indices of each row's k largest entries, largest first",
        ),
        TensorSpec("top_values", FLOAT, min_rank=3, max_rank=3, description="[B, R, k] with top_k: those entries"),
    ),
    default_outputs=("rollout",),
    parameters=ROLLOUT_PARAMETERS,
    prepare=_prepare,
    limits="stacks",
)
