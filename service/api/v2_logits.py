"""The /v2 models ``sample`` and ``calibrate``: ``/v1/sample`` and ``/v1/calibrate`` over the Open Inference Protocol.

They run the same code as the /v1 routes (:func:`service.api.logits.compute_sample` and
:func:`~service.api.logits.compute_calibrate`); tensors are protocol inputs and outputs, the options
request ``parameters``, and what is not a tensor (the seed, diagnostics, top log-probabilities, the
reliability bins) comes back in the response ``parameters``, as JSON text where it is not a scalar.
:func:`service.app.create_app` adds :data:`MODELS` to the /v2 models.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson

from service.api import logits
from service.api.logits_schemas import CalibrateRequest, SampleRequest
from service.api.v2 import FLOAT, MASK, Model, _flag, _options, _precision, _validate
from service.api.v2_tensors import InferRequest, TensorSpec, bad
from service.api.wire import JSON_OPTIONS, _fallback
from service.runtime import Runtime

Outputs = tuple[list[tuple[str, np.ndarray]], dict[str, Any]]


def _json(value: Any) -> str:
    return orjson.dumps(value, option=JSON_OPTIONS, default=_fallback).decode()


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


def _run_sample(runtime: Runtime, request: InferRequest) -> Outputs:
    with_diagnostics = _flag(request, "diagnostics", True)
    fields = _options(request, SAMPLE, {k: k for k in SAMPLE_OPTIONS})
    wanted = list(request.outputs) if request.outputs_given else list(SAMPLE.default_outputs)
    fields.update({name: request.inputs[name] for name in ("logits", "mask") if name in request.inputs})
    fields["precision"] = _precision(request, ("logits",))
    extra = ["diagnostics"] if with_diagnostics else []
    if fields.get("top_logprobs"):
        extra.append("top_logprobs")
    fields["return"] = wanted + extra
    req = _validate(SampleRequest, fields, SAMPLE)
    previous = request.inputs.get("previous_tokens")
    body = logits.compute_sample(runtime, req, previous_tokens=previous)
    params: dict[str, Any] = {"seed": body["seed"]}
    for key in extra:
        params[key] = _json(body[key])
    params["timing_ms"] = _json(body["timing_ms"])
    return [(name, body[name]) for name in wanted], params


SAMPLE = Model(
    name="sample",
    description=(
        "Logits post-processing and sampling (semantics.md): mask, repetition/frequency/presence penalties with "
        "previous_tokens, temperature (0 = greedy), top_k, top_p, min_p, then n draws per row from the final "
        "distribution (Philox generator, seed in the parameters). FP64 logits compute in float64."
    ),
    inputs=(
        TensorSpec("logits", FLOAT, min_rank=1, max_rank=2, description="(V,) or (N, V)"),
        TensorSpec(
            "previous_tokens",
            ("INT64",),
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
    run=_run_sample,
    limits=logits.logits_limits,
)


CALIBRATE_PARAMETERS = {
    "bins": "integer >= 1 (default 15): equal-width confidence bins of the ECE",
    "method": 'string: "temperature" (the only method)',
}


def _run_calibrate(runtime: Runtime, request: InferRequest) -> Outputs:
    fields = _options(request, CALIBRATE, {"bins": "bins", "method": "method"})
    fields["logits"] = request.inputs["logits"]
    labels = request.inputs["labels"]
    if labels.shape[0] != request.inputs["logits"].shape[0]:
        raise bad(f"input 'labels' has {labels.shape[0]} values; logits has {request.inputs['logits'].shape[0]} rows")
    fields["labels"] = labels.tolist()
    req = _validate(CalibrateRequest, fields, CALIBRATE)
    body = logits.compute_calibrate(runtime, req)
    outputs = {
        "temperature": np.array([body["temperature"]]),
        "nll": np.array([body["nll"]["before"], body["nll"]["after"]]),
        "ece": np.array([body["ece"]["before"], body["ece"]["after"]]),
        "accuracy": np.array([body["accuracy"]]),
    }
    wanted = list(request.outputs) if request.outputs_given else list(CALIBRATE.default_outputs)
    params = {
        "bounded": body["bounded"],
        "reliability": _json(body["reliability"]),
        "timing_ms": _json(body["timing_ms"]),
    }
    return [(name, outputs[name]) for name in wanted], params


CALIBRATE = Model(
    name="calibrate",
    description=(
        "Temperature scaling (Guo et al. 2017): the T in [0.01, 100] minimizing the mean NLL of the labels. "
        "Outputs FP64: temperature (1,), nll and ece (2,) as [before, after], accuracy (1,); the response "
        "parameters carry bounded and the reliability bins (JSON text)."
    ),
    inputs=(
        TensorSpec("logits", FLOAT, min_rank=2, max_rank=2, description="(N, C)"),
        TensorSpec("labels", ("INT64",), min_rank=1, max_rank=1, description="(N,) class indices in [0, C)"),
    ),
    outputs=(
        TensorSpec("temperature", ("FP64",), min_rank=1, max_rank=1, description="(1,) the fitted T"),
        TensorSpec("nll", ("FP64",), min_rank=1, max_rank=1, description="(2,) mean NLL before and after"),
        TensorSpec("ece", ("FP64",), min_rank=1, max_rank=1, description="(2,) ECE before and after"),
        TensorSpec("accuracy", ("FP64",), min_rank=1, max_rank=1, description="(1,) top-1 accuracy"),
    ),
    default_outputs=("temperature", "nll", "ece", "accuracy"),
    parameters=CALIBRATE_PARAMETERS,
    run=_run_calibrate,
    limits=logits.logits_limits,
)

MODELS: dict[str, Model] = {m.name: m for m in (SAMPLE, CALIBRATE)}
