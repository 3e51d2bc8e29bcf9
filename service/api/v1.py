"""The /v1 JSON API: attention, softmax, engines and models (api.md)."""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from typing import Any

import numpy as np
from fastapi import APIRouter, Request
from pydantic import ValidationError
from starlette.responses import Response

from service.api import budget, codecs
from service.api.errors import ProblemError, pydantic_errors, summarize
from service.api.schemas import AttentionRequest, AttentionResponse, Problem, SoftmaxRequest, SoftmaxResponse
from service.api.wire import json_response, parse_json_object, read_body, run_cpu
from service.core.attention import Dims, check_dims, check_params
from service.core.backward import BackwardTask, gradient_health, jacobian_norms
from service.core.diagnostics import attention_diagnostics, probability_diagnostics
from service.core.probabilities import normalize_logits
from service.core.types import AttentionInputs, AttentionParams, AttentionResult, AttentionTask
from service.engines.base import Engine
from service.engines.dispatch import Admit, EngineNotReady, EngineOverBudget, EngineUnavailable
from service.observability.tracing import record_phases
from service.runtime import Runtime

PROBLEM_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": Problem, "content": {"application/problem+json": {}}, "description": desc}
    for status, desc in (
        (413, "Request too large (estimated work or response size over budget)"),
        (415, "Content-Type is not JSON (application/json or application/*+json)"),
        (422, "Invalid input; `errors` names each offending field"),
        (503, "Engine not ready"),
    )
}

ATTENTION_TENSORS = ("query", "key", "value", "mask")
SOFTMAX_TENSORS = ("logits", "mask")
ROW_KEYS = ("entropy", "normalized_entropy", "max_weight", "argmax", "effective_support", "zeros", "attention_distance")

router = APIRouter(prefix="/v1", tags=["attention"])


def _runtime(request: Request) -> Runtime:
    runtime: Runtime = request.app.state.runtime
    return runtime


def _validate(model: type[AttentionRequest] | type[SoftmaxRequest], obj: dict[str, Any]) -> Any:
    try:
        return model.model_validate(obj)
    except ValidationError as exc:
        errors = pydantic_errors(exc)
        raise ProblemError(422, summarize(errors), errors=errors) from None


def _limits(runtime: Runtime) -> codecs.TensorLimits:
    s = runtime.settings
    return codecs.TensorLimits(max_rank=s.max_rank, max_dim=s.max_dim, max_elements=s.max_tensor_elements)


def _budget(runtime: Runtime) -> budget.Budget:
    s = runtime.settings
    return budget.Budget(
        max_work_flops=s.max_work_flops, max_response_bytes=s.max_response_bytes, max_memory_bytes=s.memory_budget_bytes
    )


def decode_tensor(
    value: Any, name: str, *, kind: codecs.TensorKind = "float", limits: codecs.TensorLimits
) -> np.ndarray:
    """A wire tensor decoded into numpy; an array is taken as it is (/v2 decodes its own tensors and checks
    their limits).
    """
    if isinstance(value, np.ndarray):
        return value
    return codecs.decode_tensor(value, name, kind=kind, limits=limits)


def _check_alpha(normalizer: str, alpha: float | None) -> None:
    """``alpha`` belongs to ``entmax`` only; elsewhere it is a mistake worth saying."""
    if alpha is not None and normalizer != "entmax":
        msg = "alpha is only used with normalizer 'entmax'"
        raise ProblemError(422, msg, errors=[{"loc": ["alpha"], "msg": msg}])


def _float_mask_as(mask: np.ndarray | None, dtype: np.dtype) -> np.ndarray | None:
    """A float mask in the compute dtype, finite or -inf (a masked position); a bool mask as it is."""
    if mask is None or mask.dtype == bool:
        return mask
    with np.errstate(over="ignore"):
        mask = np.asarray(mask, dtype=dtype)
    codecs.check_finite(mask, "mask", allow_neg_inf=True)
    return mask


def _timing(**marks: float) -> dict[str, float]:
    """Milliseconds between consecutive ``perf_counter`` marks (the keys name the intervals), and the total."""
    times = list(marks.values())
    names = list(marks)[1:]
    out = {
        name: round((t1 - t0) * 1e3, 3) for name, t0, t1 in zip(names, times, times[1:], strict=False)
    }  # names has one key fewer than times
    out["total"] = round((times[-1] - times[0]) * 1e3, 3)
    record_phases(marks)  # the same intervals as spans, when tracing is on
    return out


def _json_body(schema: str) -> dict[str, Any]:
    """``openapi_extra`` for a route that parses its own JSON body (see service/api/docs.py)."""
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema}"}}},
        }
    }


Estimate = Callable[[Dims, str, Collection[str], str, str, float | None], tuple[float, int]]
Memory = Callable[[Dims, Collection[str], str, int], int]


def build_attention_task(
    req: AttentionRequest,
    runtime: Runtime,
    estimate: Estimate = budget.attention_estimate,
    memory: Memory | None = None,
) -> AttentionTask:
    """Decode and check a request's tensors, enforce the budget, and build the engine task.

    ``estimate`` gives the request's (flops, response bytes): the forward's by default. ``memory``
    gives its peak bytes, reserved here on the request's lease; without it (the forward), the
    engine's own estimate is checked and reserved when the dispatcher picks an engine.
    """
    limits = _limits(runtime)
    dtype = np.dtype(req.precision)
    query = decode_tensor(req.query, "query", limits=limits)
    key = decode_tensor(req.key, "key", limits=limits)
    value = decode_tensor(req.value, "value", limits=limits)
    mask = None if req.mask is None else decode_tensor(req.mask, "mask", kind="mask", limits=limits)
    dims = check_dims(query.shape, key.shape, value.shape)
    params = AttentionParams(
        normalizer=req.normalizer,
        alpha=req.alpha,
        scale=req.scale,
        temperature=req.temperature,
        causal=req.causal_alignment,
    )
    _check_alpha(req.normalizer, req.alpha)
    check_params(params)
    returned = set(req.return_)
    flops, size = estimate(dims, req.normalizer, returned, req.precision, req.encoding, req.alpha)
    if memory is not None:
        budget.enforce(_budget(runtime), flops, size, memory(dims, returned, req.precision, size))
    else:  # the forward's memory depends on the engine: checked and reserved when one is chosen (_admission)
        reason = budget.check(_budget(runtime), flops, size)
        if reason is not None:
            raise ProblemError(413, reason)
    query = codecs.cast_checked(query, dtype, "query")
    key = codecs.cast_checked(key, dtype, "key")
    value = codecs.cast_checked(value, dtype, "value")
    for name, arr in (("query", query), ("key", key), ("value", value)):
        codecs.check_finite(arr, name)
    mask = _float_mask_as(mask, dtype)
    key_lengths = None if req.key_lengths is None else np.asarray(req.key_lengths, dtype=np.int64)
    return AttentionTask(
        inputs=AttentionInputs(query=query, key=key, value=value, mask=mask, key_lengths=key_lengths),
        params=params,
        dtype=dtype,
        need_weights=bool({"weights", "diagnostics", "gradient_health"} & returned),
        # relu's Jacobian depends on the scores, not on the weights alone
        need_scores="scores" in returned
        or "diagnostics" in returned
        or ("gradient_health" in returned and req.normalizer == "relu"),
    )


def _row_shape(task: AttentionTask) -> tuple[int, ...]:
    return task.inputs.query.shape[:-1]


def gradient_health_report(task: AttentionTask, result: AttentionResult, threshold: float) -> dict[str, Any]:
    """``{"threshold", "heads": [...]}``: per head, the normalizer's mean Jacobian norm and the vanishing fraction."""
    assert result.weights is not None
    B, Hq, L = result.valid_keys.shape
    weights = result.weights.reshape(B, Hq, L, -1)
    scores = None if result.scores is None else result.scores.reshape(B, Hq, L, -1)
    norms = jacobian_norms(task.params.normalizer, weights, z=scores, alpha=task.params.alpha)
    health = gradient_health(norms, result.valid_keys, threshold)
    return {"threshold": threshold, "heads": health.heads()}


def _admission(runtime: Runtime, req: AttentionRequest, task: AttentionTask) -> Admit:
    """The dispatcher's check of each candidate engine: its own work and memory estimates against the
    limits (a reason when over), and, when it fits, its memory reserved on the request's lease.
    """
    limits = _budget(runtime)
    returned = set(req.return_)
    q, k, v = task.inputs.query.shape, task.inputs.key.shape, task.inputs.value.shape
    dims = check_dims(q, k, v)
    response = budget.attention_response_bytes(dims, returned, req.precision, req.encoding)

    def admit(engine: Engine, task: AttentionTask | BackwardTask) -> str | None:
        estimate = getattr(engine, "cost", None)
        cost = estimate(task) if callable(estimate) else None
        if cost is None:
            return None
        memory = budget.attention_memory(cost, dims, req.precision, response)
        reason = budget.check(limits, cost.work_flops, response, memory)
        if reason is None:
            budget.reserve(memory)
        return reason

    return admit


def _compute_attention(runtime: Runtime, req: AttentionRequest) -> dict[str, Any]:
    t0 = time.perf_counter()
    task = build_attention_task(req, runtime)
    t1 = time.perf_counter()
    try:
        result, choice = runtime.dispatcher.run(task, req.engine, _admission(runtime, req, task))
    except EngineOverBudget as exc:
        raise ProblemError(413, str(exc)) from None
    except EngineUnavailable as exc:
        raise ProblemError(422, str(exc), errors=[{"loc": ["engine"], "msg": str(exc)}]) from None
    except EngineNotReady as exc:
        raise ProblemError(503, str(exc), headers={"Retry-After": "5"}) from None
    t2 = time.perf_counter()
    returned = set(req.return_)
    body: dict[str, Any] = {}
    enc = req.encoding
    if "output" in returned:
        body["output"] = codecs.encode_tensor(result.output, enc)
    if "weights" in returned and result.weights is not None:
        body["weights"] = codecs.encode_tensor(result.weights, enc)
    if "scores" in returned and result.scores is not None:
        body["scores"] = codecs.encode_tensor(result.scores, enc)
    t3 = time.perf_counter()
    if "diagnostics" in returned:
        assert result.weights is not None
        B, Hq, L = result.valid_keys.shape
        diag = attention_diagnostics(
            result.weights.reshape(B, Hq, L, -1),
            result.valid_keys,
            scores=None if result.scores is None else result.scores.reshape(B, Hq, L, -1),
            output=result.output,
            causal=task.params.causal,
            thresholds=runtime.settings.diagnostic_thresholds(),
        )
        rows = _row_shape(task)
        for k in ROW_KEYS:
            if k in diag and isinstance(diag[k], np.ndarray):
                diag[k] = np.ascontiguousarray(diag[k].reshape(rows))
        body["diagnostics"] = diag
    if "gradient_health" in returned:
        body["gradient_health"] = gradient_health_report(task, result, runtime.settings.diag_vanishing_threshold)
    t4 = time.perf_counter()
    body["engine"] = {"name": choice.name, "provider": choice.provider, "reason": choice.reason}
    body["timing_ms"] = _timing(start=t0, decode=t1, compute=t2, encode=t3, diagnostics=t4)
    return body


@router.post(
    "/attention",
    response_model=AttentionResponse,
    responses=PROBLEM_RESPONSES,
    summary="Compute attention",
    openapi_extra=_json_body("AttentionRequest"),
)
async def post_attention(request: Request) -> Response:
    """Scaled dot-product attention with masks, temperature and a choice of normalizer.

    Pipeline (semantics.md): `scores = scale * Q K^T`, plus the mask bias, divided by the
    temperature, normalized over the keys, then `output = A V`. Fully masked rows give zeros.
    """
    raw = await read_body(request)
    return await run_cpu(request, len(raw), _attention_response, _runtime(request), raw)


def _attention_response(runtime: Runtime, raw: bytes) -> Response:
    """Parse, validate, compute and serialize: all the CPU work of one request (see ``run_cpu``)."""
    return json_response(
        _compute_attention(runtime, _validate(AttentionRequest, parse_json_object(raw, ATTENTION_TENSORS)))
    )


def _compute_softmax(runtime: Runtime, req: SoftmaxRequest) -> dict[str, Any]:
    t0 = time.perf_counter()
    limits = _limits(runtime)
    logits = decode_tensor(req.logits, "logits", kind="logits", limits=limits)
    dtype = np.dtype(req.precision)
    logits = codecs.cast_checked(logits, dtype, "logits")
    codecs.check_finite(logits, "logits")
    mask = None if req.mask is None else decode_tensor(req.mask, "mask", kind="mask", limits=limits)
    mask = _float_mask_as(mask, dtype)
    _check_alpha(req.normalizer, req.alpha)
    flops, size = budget.softmax_estimate(
        logits.shape, req.axis, req.normalizer, req.log, req.precision, req.encoding, req.alpha
    )
    budget.enforce(_budget(runtime), flops, size, budget.softmax_memory(logits.shape, req.log, req.precision, size))
    t1 = time.perf_counter()
    result = normalize_logits(
        logits,
        normalizer=req.normalizer,
        alpha=req.alpha,
        temperature=req.temperature,
        mask=mask,
        axis=req.axis,
        with_log=req.log,
        dtype=dtype,
    )
    t2 = time.perf_counter()
    body: dict[str, Any] = {"probabilities": codecs.encode_tensor(result.probabilities, req.encoding)}
    if result.log_probabilities is not None:
        body["log_probabilities"] = codecs.encode_tensor(result.log_probabilities, req.encoding)
    body["diagnostics"] = probability_diagnostics(result.probabilities, axis=req.axis)
    t3 = time.perf_counter()
    body["timing_ms"] = _timing(start=t0, decode=t1, compute=t2, diagnostics=t3)
    return body


@router.post(
    "/softmax",
    response_model=SoftmaxResponse,
    responses=PROBLEM_RESPONSES,
    summary="Normalize logits along an axis",
    openapi_extra=_json_body("SoftmaxRequest"),
)
async def post_softmax(request: Request) -> Response:
    """Softmax (optionally with log-probabilities), sparsemax, entmax or ReLU normalization of a logits tensor."""
    raw = await read_body(request)
    return await run_cpu(request, len(raw), _softmax_response, _runtime(request), raw)


def _softmax_response(runtime: Runtime, raw: bytes) -> Response:
    return json_response(_compute_softmax(runtime, _validate(SoftmaxRequest, parse_json_object(raw, SOFTMAX_TENSORS))))
