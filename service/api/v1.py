"""The /v1 JSON API: attention, softmax, engines and models (api.md)."""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import numpy as np
from fastapi import APIRouter, Request
from pydantic import BaseModel, ValidationError
from starlette.responses import Response

from service.api import budget, codecs
from service.api.errors import ProblemError, pydantic_errors, summarize
from service.api.schemas import (
    AttentionRequest,
    AttentionResponse,
    SoftmaxOptions,
    SoftmaxRequest,
    SoftmaxResponse,
)
from service.api.wire import json_response, parse_json_object, read_body, run_cpu
from service.core.attention import Dims, check_dims, check_params
from service.core.backward import BackwardTask, gradient_health, jacobian_norms
from service.core.diagnostics import DiagnosticThresholds, attention_diagnostics, probability_diagnostics
from service.core.probabilities import normalize_logits
from service.core.types import AttentionInputs, AttentionParams, AttentionResult, AttentionTask
from service.engines.base import Engine
from service.engines.dispatch import Admit, EngineNotReady, EngineOverBudget, EngineUnavailable
from service.observability.tracing import record_phases
from service.runtime import Runtime
from service.settings import Settings

PROBLEM_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {
        "description": desc,
        "content": {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}},
    }
    for status, desc in (
        (400, "The request body is not valid JSON, gzip or deflate data"),
        (413, "Request too large (estimated work or response size over budget)"),
        (415, "Content-Type is not JSON, or an unsupported Content-Encoding"),
        (422, "Invalid input; `errors` names each offending field"),
        (503, "Overloaded, or the engine is not ready (Retry-After)"),
    )
}

ATTENTION_TENSORS = ("query", "key", "value", "mask")
SOFTMAX_TENSORS = ("logits", "mask")
ROW_KEYS = ("entropy", "normalized_entropy", "max_weight", "argmax", "effective_support", "zeros", "attention_distance")

router = APIRouter(prefix="/v1", tags=["attention"])


def _runtime(request: Request) -> Runtime:
    runtime: Runtime = request.app.state.runtime
    return runtime


def _validate(model: type[BaseModel], obj: dict[str, Any]) -> Any:
    try:
        return model.model_validate(obj)
    except ValidationError as exc:
        errors = pydantic_errors(exc)
        raise ProblemError(422, summarize(errors), errors=errors) from None


@dataclass(frozen=True, slots=True)
class _Derived:
    """What the request path derives from the settings: built once per settings object, not per request."""

    settings: Settings
    limits: codecs.TensorLimits
    budget: budget.Budget
    thresholds: DiagnosticThresholds


_DERIVED: dict[int, _Derived] = {}


def _derived(runtime: Runtime) -> _Derived:
    s = runtime.settings
    hit = _DERIVED.get(id(s))
    if hit is None or hit.settings is not s:  # a new settings object (an id may be reused after one is freed)
        if len(_DERIVED) > 64:
            _DERIVED.clear()
        hit = _Derived(
            settings=s,
            limits=codecs.TensorLimits(max_rank=s.max_rank, max_dim=s.max_dim, max_elements=s.max_tensor_elements),
            budget=budget.Budget(
                max_work_flops=s.max_work_flops,
                max_response_bytes=s.max_response_bytes,
                max_memory_bytes=s.memory_budget_bytes,
            ),
            thresholds=s.diagnostic_thresholds(),
        )
        _DERIVED[id(s)] = hit
    return hit


def _limits(runtime: Runtime) -> codecs.TensorLimits:
    return _derived(runtime).limits


def _budget(runtime: Runtime) -> budget.Budget:
    return _derived(runtime).budget


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


class AttentionOptionsLike(Protocol):
    """The scalar options of attention: an :class:`AttentionRequest` (/v1) or :class:`AttentionOptions` (/v2)."""

    @property
    def normalizer(self) -> str: ...
    @property
    def alpha(self) -> float | None: ...
    @property
    def scale(self) -> float | None: ...
    @property
    def temperature(self) -> float: ...
    @property
    def causal_alignment(self) -> Literal["top_left", "bottom_right"] | None: ...


def attention_task(
    runtime: Runtime,
    *,
    query: Any,
    key: Any,
    value: Any,
    mask: Any,
    key_lengths: Any,
    options: AttentionOptionsLike,
    precision: str,
    returned: Collection[str],
    encoding: str,
    estimate: Estimate = budget.attention_estimate,
    memory: Memory | None = None,
) -> AttentionTask:
    """Decode and check the tensors (wire forms or arrays), enforce the budget, and build the engine task.

    ``estimate`` gives the request's (flops, response bytes): the forward's by default. ``memory``
    gives its peak bytes, reserved here on the request's lease; without it (the forward), the
    engine's own estimate is checked and reserved when the dispatcher picks an engine.
    """
    limits = _limits(runtime)
    dtype = np.dtype(precision)
    q = decode_tensor(query, "query", limits=limits)
    k = decode_tensor(key, "key", limits=limits)
    v = decode_tensor(value, "value", limits=limits)
    m = None if mask is None else decode_tensor(mask, "mask", kind="mask", limits=limits)
    dims = check_dims(q.shape, k.shape, v.shape)
    params = AttentionParams(
        normalizer=options.normalizer,
        alpha=options.alpha,
        scale=options.scale,
        temperature=options.temperature,
        causal=options.causal_alignment,
    )
    _check_alpha(options.normalizer, options.alpha)
    check_params(params)
    flops, size = estimate(dims, options.normalizer, returned, precision, encoding, options.alpha)
    if memory is not None:
        budget.enforce(_budget(runtime), flops, size, memory(dims, returned, precision, size))
    else:  # the forward's memory depends on the engine: checked and reserved when one is chosen (_admission)
        reason = budget.check(_budget(runtime), flops, size)
        if reason is not None:
            raise ProblemError(413, reason)
    q = codecs.finite_as(q, dtype, "query")
    k = codecs.finite_as(k, dtype, "key")
    v = codecs.finite_as(v, dtype, "value")
    m = _float_mask_as(m, dtype)
    lengths = None if key_lengths is None else np.asarray(key_lengths, dtype=np.int64)
    return AttentionTask(
        inputs=AttentionInputs(query=q, key=k, value=v, mask=m, key_lengths=lengths),
        params=params,
        dtype=dtype,
        need_weights=bool({"weights", "diagnostics", "gradient_health"} & set(returned)),
        # relu's Jacobian depends on the scores, not on the weights alone
        need_scores="scores" in returned
        or "diagnostics" in returned
        or ("gradient_health" in returned and options.normalizer == "relu"),
    )


def build_attention_task(
    req: AttentionRequest,
    runtime: Runtime,
    estimate: Estimate = budget.attention_estimate,
    memory: Memory | None = None,
) -> AttentionTask:
    """The engine task of a /v1 request (:func:`attention_task` with the request's fields)."""
    return attention_task(
        runtime,
        query=req.query,
        key=req.key,
        value=req.value,
        mask=req.mask,
        key_lengths=req.key_lengths,
        options=req,
        precision=req.precision,
        returned=set(req.return_),
        encoding=req.encoding,
        estimate=estimate,
        memory=memory,
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


def _admission(
    runtime: Runtime, returned: Collection[str], precision: str, encoding: str, task: AttentionTask
) -> Admit:
    """The dispatcher's check of each candidate engine: its own work and memory estimates against the
    limits (a reason when over), and, when it fits, its memory reserved on the request's lease.
    """
    limits = _budget(runtime)
    q, k, v = task.inputs.query.shape, task.inputs.key.shape, task.inputs.value.shape
    dims = check_dims(q, k, v)
    response = budget.attention_response_bytes(dims, returned, precision, encoding)

    def admit(engine: Engine, task: AttentionTask | BackwardTask) -> str | None:
        estimate = getattr(engine, "cost", None)
        cost = estimate(task) if callable(estimate) else None
        if cost is None:
            return None
        memory = budget.attention_memory(cost, dims, precision, response)
        reason = budget.check(limits, cost.work_flops, response, memory)
        if reason is None:
            budget.reserve(memory)
        return reason

    return admit


def _compute_attention(runtime: Runtime, req: AttentionRequest) -> dict[str, Any]:
    t0 = time.perf_counter()
    task = build_attention_task(req, runtime)
    return compute_attention(runtime, task, req.engine, set(req.return_), req.precision, req.encoding, t0)


def compute_attention(
    runtime: Runtime,
    task: AttentionTask,
    engine: str,
    returned: Collection[str],
    precision: str,
    encoding: str,
    t0: float,
) -> dict[str, Any]:
    """Run a task on the engine ``engine`` asks for and build the response body (tensors, diagnostics, timings).

    ``t0`` is when the request's decoding started (``time.perf_counter``), for ``timing_ms``.
    """
    t1 = time.perf_counter()
    try:
        result, choice = runtime.dispatcher.run(task, engine, _admission(runtime, returned, precision, encoding, task))
    except EngineOverBudget as exc:
        raise ProblemError(413, str(exc)) from None
    except EngineUnavailable as exc:
        raise ProblemError(422, str(exc), errors=[{"loc": ["engine"], "msg": str(exc)}]) from None
    except EngineNotReady as exc:
        raise ProblemError(503, str(exc), headers=exc.headers) from None
    t2 = time.perf_counter()
    body: dict[str, Any] = {}
    enc = encoding
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
            thresholds=_derived(runtime).thresholds,
        )
        rows = _row_shape(task)
        for k in ROW_KEYS:  # (B, Hq, L) -> the query's rows: rank-2 and rank-3 queries drop the leading axes
            arr = diag.get(k)
            if isinstance(arr, np.ndarray) and (arr.shape != rows or not arr.flags.c_contiguous):
                diag[k] = np.ascontiguousarray(arr.reshape(rows))
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
    return compute_softmax(runtime, req.logits, req.mask, req, req.precision, req.encoding)


def compute_softmax(
    runtime: Runtime,
    logits_in: Any,
    mask_in: Any,
    options: SoftmaxOptions | SoftmaxRequest,
    precision: str,
    encoding: str,
) -> dict[str, Any]:
    """Decode (wire forms or arrays), check, normalize and build the response body of a softmax request."""
    t0 = time.perf_counter()
    limits = _limits(runtime)
    logits = decode_tensor(logits_in, "logits", kind="logits", limits=limits)
    dtype = np.dtype(precision)
    logits = codecs.finite_as(logits, dtype, "logits")
    mask = None if mask_in is None else decode_tensor(mask_in, "mask", kind="mask", limits=limits)
    mask = _float_mask_as(mask, dtype)
    _check_alpha(options.normalizer, options.alpha)
    flops, size = budget.softmax_estimate(
        logits.shape, options.axis, options.normalizer, options.log, precision, encoding, options.alpha
    )
    budget.enforce(_budget(runtime), flops, size, budget.softmax_memory(logits.shape, options.log, precision, size))
    t1 = time.perf_counter()
    result = normalize_logits(
        logits,
        normalizer=options.normalizer,
        alpha=options.alpha,
        temperature=options.temperature,
        mask=mask,
        axis=options.axis,
        with_log=options.log,
        dtype=dtype,
    )
    t2 = time.perf_counter()
    body: dict[str, Any] = {"probabilities": codecs.encode_tensor(result.probabilities, encoding)}
    if result.log_probabilities is not None:
        body["log_probabilities"] = codecs.encode_tensor(result.log_probabilities, encoding)
    body["diagnostics"] = probability_diagnostics(result.probabilities, axis=options.axis)
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
