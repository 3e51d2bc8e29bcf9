"""The models ``softmax``, ``sample`` and ``calibrate``: the operations on logits over the inference protocol.

What is not a tensor (the seed, diagnostics, top log-probabilities, the reliability bins, the timings)
comes back in the response parameters, as JSON text where it is not a scalar.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from service.dataplane import logits as logits_op
from service.dataplane import sampling as sampling_op
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
from service.dataplane.options import CalibrateOptions, SampleOptions, SoftmaxOptions
from service.dataplane.scheduling import Job
from service.dataplane.timing import Timing

SOFTMAX_PARAMETERS = {
    **COMMON_PARAMETERS,
    "axis": "integer (default -1): the axis normalized over",
    "log": "bool: also return log_probabilities (softmax only); implied when log_probabilities is requested",
}
SOFTMAX_OPTIONS = ("normalizer", "alpha", "temperature", "axis", "log")


def _prepare_softmax(ctx: Context, request: InferRequest, timing: Timing) -> Job[InferResult]:
    with_diagnostics = flag(request, "diagnostics", True)
    fields = option_fields(request, SOFTMAX, SOFTMAX_OPTIONS)
    if request.outputs_given:
        wanted = list(request.outputs)
        if "log_probabilities" in wanted and "log" not in fields:
            fields["log"] = True
    else:
        wanted = ["probabilities"] + (["log_probabilities"] if fields.get("log") is True else [])
    options = validated(SoftmaxOptions, fields, SOFTMAX)
    precision = precision_of(request, ("logits",))
    inputs = request.inputs
    encoding = response_encoding(request, wanted)
    job = logits_op.softmax(
        ctx, inputs["logits"], inputs.get("mask"), options, precision=precision, encoding=encoding, timing=timing
    )
    if "log_probabilities" in wanted and not options.log:
        raise invalid("output 'log_probabilities' needs parameter log = true")

    def finish(out: logits_op.SoftmaxOutcome) -> InferResult:
        arrays = {"probabilities": out.probabilities, "log_probabilities": out.log_probabilities}
        outputs = [(name, np.ascontiguousarray(arrays[name])) for name in wanted]
        params: dict[str, Any] = {}
        if with_diagnostics:
            params["diagnostics"] = json_text(out.diagnostics)
        params["timing_ms"] = json_text(timing.ms(logits_op.SOFTMAX_TIMING_ORDER))
        return InferResult(outputs, params)

    return job.then(finish)


SOFTMAX = Model(
    name="softmax",
    description="Normalizes logits along one axis: (logits + float mask) / temperature, then the normalizer; "
    "a BOOL mask removes positions.",
    inputs=(
        TensorSpec("logits", FLOAT_IN, min_rank=1, description="any rank 1 to 4"),
        TensorSpec(
            "mask",
            MASK,
            min_rank=1,
            optional=True,
            description="BOOL (true = keep) or additive float, broadcastable to the logits",
        ),
    ),
    outputs=(
        TensorSpec("probabilities", FLOAT, min_rank=1, description="the logits' shape"),
        TensorSpec("log_probabilities", FLOAT, min_rank=1, description="softmax only; masked = -inf"),
    ),
    default_outputs=("probabilities",),
    parameters=SOFTMAX_PARAMETERS,
    prepare=_prepare_softmax,
)


SAMPLE_OPTIONS = (
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "n",
    "seed",
    "top_logprobs",
)
SAMPLE_PARAMETERS = {
    "temperature": "number >= 0 (default 1); 0 = greedy",
    "top_k": "integer >= 0 (default 0 = off)",
    "top_p": "number in (0, 1] (default 1 = off)",
    "min_p": "number in [0, 1) (default 0 = off)",
    "repetition_penalty": "number > 0 (default 1)",
    "presence_penalty": "number (default 0)",
    "frequency_penalty": "number (default 0)",
    "n": "integer >= 1 (default 1): draws per row",
    "seed": "integer >= 0: the same request and seed give the same tokens; without one the server draws one",
    "top_logprobs": "integer 0 to 20: the most probable tokens per row, as JSON text in the response parameters",
    "diagnostics": "bool (default true): return diagnostics in the response parameters",
    "binary_data_output": "bool (default false): return every output not listed otherwise as binary data",
}


def _prepare_sample(ctx: Context, request: InferRequest, timing: Timing) -> Job[InferResult]:
    with_diagnostics = flag(request, "diagnostics", True)
    fields = option_fields(request, SAMPLE, SAMPLE_OPTIONS)
    wanted = SAMPLE.wanted(request)
    precision = precision_of(request, ("logits",))
    extra = ["diagnostics"] if with_diagnostics else []
    if fields.get("top_logprobs"):
        extra.append("top_logprobs")
    options = validated(SampleOptions, fields, SAMPLE)
    inputs = request.inputs
    job = sampling_op.sample(
        ctx,
        inputs["logits"],
        inputs.get("mask"),
        inputs.get("previous_tokens"),
        options,
        precision=precision,
        returned=wanted + extra,
        encoding="json",  # tokens are int64: priced as JSON, never below their raw size
        timing=timing,
    )

    def finish(out: sampling_op.SampleOutcome) -> InferResult:
        arrays = {
            "tokens": out.tokens,
            "logprobs": out.logprobs,
            "raw_logprobs": out.raw_logprobs,
            "probabilities": out.probabilities,
        }
        outputs = [(name, np.ascontiguousarray(arrays[name])) for name in wanted]
        timing.phase("encode")
        params: dict[str, Any] = {"seed": out.seed}
        if "diagnostics" in extra:
            params["diagnostics"] = json_text(out.diagnostics)
        if "top_logprobs" in extra:
            params["top_logprobs"] = json_text(out.top_logprobs)
        params["timing_ms"] = json_text(timing.ms(sampling_op.TIMING_ORDER))
        return InferResult(outputs, params)

    return job.then(finish)


SAMPLE = Model(
    name="sample",
    description=(
        "Logits post-processing and sampling: mask, repetition/frequency/presence penalties with "
        "previous_tokens, temperature (0 = greedy), top_k, top_p, min_p, then n draws per row from the final "
        "distribution (Philox generator, seed in the parameters). FP64 logits compute in float64."
    ),
    inputs=(
        TensorSpec("logits", FLOAT_IN, min_rank=1, max_rank=2, description="(V,) or (N, V)"),
        TensorSpec(
            "previous_tokens",
            INDEX,
            min_rank=1,
            max_rank=2,
            optional=True,
            description="(T,): one list for every row, or (N, T): one list per row, -1 = padding",
        ),
        TensorSpec(
            "mask", MASK, min_rank=1, max_rank=2, optional=True, description="BOOL (true = keep) or additive float"
        ),
    ),
    outputs=(
        TensorSpec("tokens", ("INT64",), min_rank=1, max_rank=2, description="(n,) or (N, n)"),
        TensorSpec("logprobs", FLOAT, min_rank=1, max_rank=2, description="of the tokens, final distribution"),
        TensorSpec("raw_logprobs", FLOAT, min_rank=1, max_rank=2, description="of the tokens, log_softmax(logits)"),
        TensorSpec(
            "probabilities", FLOAT, min_rank=1, max_rank=2, description="the final distribution (logits' shape)"
        ),
    ),
    default_outputs=("tokens", "logprobs"),
    parameters=SAMPLE_PARAMETERS,
    prepare=_prepare_sample,
    limits="logits",
)


CALIBRATE_PARAMETERS = {
    "bins": "integer >= 1 (default 15): equal-width confidence bins of the ECE",
    "method": 'string: "temperature" (the only method)',
}


def _prepare_calibrate(ctx: Context, request: InferRequest, timing: Timing) -> Job[InferResult]:
    fields = option_fields(request, CALIBRATE, ("bins", "method"))
    logits, labels = request.inputs["logits"], request.inputs["labels"]
    if labels.shape[0] != logits.shape[0]:
        raise invalid(f"input 'labels' has {labels.shape[0]} values; logits has {logits.shape[0]} rows")
    options = validated(CalibrateOptions, fields, CALIBRATE)
    wanted = CALIBRATE.wanted(request)

    def finish(out: logits_op.CalibrateOutcome) -> InferResult:
        arrays = {
            "temperature": np.array([out.temperature]),
            "nll": np.array([out.nll_before, out.nll_after]),
            "ece": np.array([out.ece_before, out.ece_after]),
            "accuracy": np.array([out.accuracy]),
        }
        params = {
            "bounded": out.bounded,
            "reliability": json_text({"before": out.reliability_before, "after": out.reliability_after}),
            "timing_ms": json_text(timing.ms(logits_op.CALIBRATE_TIMING_ORDER)),
        }
        return InferResult([(name, arrays[name]) for name in wanted], params)

    return logits_op.calibrate(ctx, logits, labels, options, timing=timing).then(finish)


CALIBRATE = Model(
    name="calibrate",
    description=(
        "Temperature scaling (Guo et al. 2017): the T in [0.01, 100] minimizing the mean NLL of the labels. "
        "Outputs FP64: temperature (1,), nll and ece (2,) as [before, after], accuracy (1,); the response "
        "parameters carry bounded and the reliability bins (JSON text)."
    ),
    inputs=(
        TensorSpec("logits", FLOAT_IN, min_rank=2, max_rank=2, description="(N, C)"),
        TensorSpec("labels", INDEX, min_rank=1, max_rank=1, description="(N,) class indices in [0, C)"),
    ),
    outputs=(
        TensorSpec("temperature", ("FP64",), min_rank=1, max_rank=1, description="(1,) the fitted T"),
        TensorSpec("nll", ("FP64",), min_rank=1, max_rank=1, description="(2,) mean NLL before and after"),
        TensorSpec("ece", ("FP64",), min_rank=1, max_rank=1, description="(2,) ECE before and after"),
        TensorSpec("accuracy", ("FP64",), min_rank=1, max_rank=1, description="(1,) top-1 accuracy"),
    ),
    default_outputs=("temperature", "nll", "ece", "accuracy"),
    parameters=CALIBRATE_PARAMETERS,
    prepare=_prepare_calibrate,
    limits="logits",
)
