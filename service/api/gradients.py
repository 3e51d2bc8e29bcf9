"""``POST /v1/attention/backward`` (gradients over HTTP) and ``POST /v1/attention/analyze`` (api.md).

Both use the machinery of ``/v1/attention``: the raw body read by
:func:`~service.api.wire.read_body`, the CPU work in :func:`~service.api.wire.run_cpu`,
validation by :func:`service.api.v1._validate`, tensors decoded by
:mod:`service.api.codecs`, a 413 from :mod:`service.api.budget` before anything
large is allocated, and problem+json errors naming the field.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
from fastapi import APIRouter, Request
from starlette.responses import Response

from service.api import budget, codecs, v1
from service.api.errors import ProblemError
from service.api.gradient_schemas import (
    AnalyzeRequest,
    AnalyzeResponse,
    AttentionBackwardRequest,
    AttentionBackwardResponse,
)
from service.api.wire import json_response, parse_json_object, read_body, run_cpu
from service.core.analysis import analyze, draw_normal, sweep_points
from service.core.attention import Dims, check_dims, check_params
from service.core.backward import BackwardTask
from service.core.types import AttentionParams, AttentionTask
from service.engines.base import Engine
from service.engines.dispatch import Admit, EngineNotReady, EngineOverBudget, EngineUnavailable
from service.runtime import Runtime

router = APIRouter(prefix="/v1", tags=["gradients"])

TENSOR_RESULTS = ("grad_query", "grad_key", "grad_value", "grad_mask", "output", "weights")
BACKWARD_TENSORS = (*v1.ATTENTION_TENSORS, "grad_output", "grad_weights")
ANALYZE_TENSORS = ("query", "key", "mask")


def _invalid(msg: str, loc: list[str | int]) -> ProblemError:
    return ProblemError(422, msg, errors=[{"loc": loc, "msg": msg}])


def _upstream(value: Any, name: str, runtime: Runtime, dtype: np.dtype) -> np.ndarray:
    """An upstream gradient decoded, cast to the compute dtype and checked finite (its shape is checked by the core)."""
    arr = v1.decode_tensor(value, name, limits=v1._limits(runtime))
    arr = codecs.cast_checked(arr, dtype, name)
    codecs.check_finite(arr, name)
    return arr


def build_backward_task(req: AttentionBackwardRequest, runtime: Runtime) -> BackwardTask:
    """Decode and check a backward request, enforce its budget (413), and build the engine task."""
    returned = list(req.return_)
    task = v1.build_attention_task(req, runtime, estimate=budget.backward_estimate, memory=budget.backward_memory)
    if "grad_mask" in returned:
        mask = task.inputs.mask
        if mask is None or mask.dtype == bool:
            raise _invalid(
                "grad_mask is the gradient of a float (additive) mask; this request has "
                + ("no mask" if mask is None else "a boolean mask"),
                ["return", returned.index("grad_mask")],
            )
    dtype = np.dtype(req.precision)
    grad_output = _upstream(req.grad_output, "grad_output", runtime, dtype)
    grad_weights = None if req.grad_weights is None else _upstream(req.grad_weights, "grad_weights", runtime, dtype)
    return BackwardTask(
        task=task,
        grad_output=grad_output,
        grad_weights=grad_weights,
        want=frozenset(returned),
        vanishing_threshold=runtime.settings.diag_vanishing_threshold,
    )


def _backward_admission(runtime: Runtime, req: AttentionBackwardRequest, bt: BackwardTask) -> Admit:
    """The dispatcher's check of each candidate engine. The numpy estimate was enforced and reserved
    when the request was decoded; an engine that runs a whole-tensor graph (ONNX) needs more memory:
    checked against the limits here, and the difference reserved when it fits.
    """
    limits = v1._budget(runtime)
    q, k, v = bt.task.inputs.query.shape, bt.task.inputs.key.shape, bt.task.inputs.value.shape
    dims = check_dims(q, k, v)
    returned = set(bt.want)
    flops, response = budget.backward_estimate(dims, req.normalizer, returned, req.precision, req.encoding, req.alpha)
    on_numpy = budget.backward_memory(dims, returned, req.precision, response)

    def admit(engine: Engine, task: AttentionTask | BackwardTask) -> str | None:
        graph_for = getattr(engine, "backward_graph_for", None)
        graph = graph_for(task) if callable(graph_for) else None
        if not isinstance(graph, str):
            return None
        memory = budget.backward_graph_memory(graph, dims, req.precision, response)
        reason = budget.check(limits, flops, response, memory)
        if reason is None and memory > on_numpy:
            budget.reserve(memory - on_numpy)
        return reason

    return admit


def compute_backward(runtime: Runtime, req: AttentionBackwardRequest) -> dict[str, Any]:
    """The response body of one backward request (arrays not yet serialized)."""
    t0 = time.perf_counter()
    bt = build_backward_task(req, runtime)
    t1 = time.perf_counter()
    try:
        result, choice = runtime.dispatcher.run_backward(bt, req.engine, _backward_admission(runtime, req, bt))
    except EngineOverBudget as exc:
        raise ProblemError(413, str(exc)) from None
    except EngineUnavailable as exc:
        raise _invalid(str(exc), ["engine"]) from None
    except EngineNotReady as exc:
        raise ProblemError(503, str(exc), headers=exc.headers) from None
    t2 = time.perf_counter()
    body: dict[str, Any] = {}
    for name in TENSOR_RESULTS:
        arr = getattr(result, name)
        if name in bt.want and arr is not None:
            body[name] = codecs.encode_tensor(arr, req.encoding)
    for name in ("grad_scale", "grad_temperature"):
        if name in bt.want:
            body[name] = getattr(result, name)
    if "gradient_health" in bt.want and result.gradient_health is not None:
        body["gradient_health"] = {
            "threshold": result.gradient_health.threshold,
            "heads": result.gradient_health.heads(),
        }
    t3 = time.perf_counter()
    body["engine"] = {"name": choice.name, "provider": choice.provider, "reason": choice.reason}
    body["timing_ms"] = v1._timing(start=t0, decode=t1, compute=t2, encode=t3)
    return body


@router.post(
    "/attention/backward",
    response_model=AttentionBackwardResponse,
    responses=v1.PROBLEM_RESPONSES,
    summary="Gradients of attention (backward pass)",
    openapi_extra=v1._json_body("AttentionBackwardRequest"),
)
async def post_attention_backward(request: Request) -> Response:
    """The gradients of `sum(output * grad_output) + sum(weights * grad_weights)` with respect to query, key and
    value, and on request the float mask, the scale and the temperature (semantics.md, "Gradients").

    Takes every /v1/attention field. Masked positions get exactly zero gradient; fully masked rows give zeros.
    """
    raw = await read_body(request)
    return await run_cpu(request, len(raw), _backward_response, request.app.state.runtime, raw)


def _backward_response(runtime: Runtime, raw: bytes) -> Response:
    req = v1._validate(AttentionBackwardRequest, parse_json_object(raw, BACKWARD_TENSORS))
    return json_response(compute_backward(runtime, req))


# --------------------------------------------------------------------------- analyze


def _check_drawn_shape(shape: tuple[int, ...], runtime: Runtime) -> None:
    """A drawn tensor obeys the limits of a sent one: 422 past the dimension limit, 413 past the element limit."""
    s = runtime.settings
    for axis, size in enumerate(shape):
        if size > s.max_dim:
            raise _invalid(f"shape[{axis}] = {size} is above the limit of {s.max_dim}", ["shape", axis])
    count = math.prod(shape)
    if count > s.max_tensor_elements:
        raise ProblemError(
            413,
            f"the drawn query and key of shape {list(shape)} would have {count} elements each, above the limit of "
            f"{s.max_tensor_elements}; draw fewer (smaller shape or head_dims)",
        )


def compute_analyze(runtime: Runtime, req: AnalyzeRequest) -> dict[str, Any]:
    """The response body of one analysis (see :mod:`service.core.analysis`)."""
    t0 = time.perf_counter()
    limits = v1._limits(runtime)
    # The mask first: an invalid one is a 422 even when the drawn shape is also too large (a 413).
    mask = None if req.mask is None else decode_mask(req.mask, limits)
    drawn = req.shape is not None
    query = key = None
    if drawn:
        for name in ("query", "key"):
            if getattr(req, name) is not None:
                raise _invalid(f"send either query and key, or shape to draw them; not both ({name} given)", [name])
        assert req.shape is not None
        B, H, L, E = req.shape
        head_dims = list(req.head_dims) if req.head_dims is not None else [E]
        for e in head_dims:
            _check_drawn_shape((B, H, L, e), runtime)
        Hkv, S = H, L
    else:
        for name in ("query", "key"):
            if getattr(req, name) is None:
                raise _invalid(f"{name} is required unless shape is given (to draw query and key)", [name])
        if req.head_dims is not None:
            raise _invalid("head_dims sweeps drawn inputs only: give shape instead of query and key", ["head_dims"])
        query = v1.decode_tensor(req.query, "query", limits=limits)
        key = v1.decode_tensor(req.key, "key", limits=limits)
        sent = check_dims(query.shape, key.shape, key.shape)
        query = codecs.cast_checked(query, np.dtype(np.float64), "query")
        key = codecs.cast_checked(key, np.dtype(np.float64), "key")
        codecs.check_finite(query, "query")
        codecs.check_finite(key, "key")
        B, H, Hkv, L, S, E = sent.B, sent.Hq, sent.Hkv, sent.L, sent.S, sent.E
        head_dims = [E]
    v1._check_alpha(req.normalizer, req.alpha)
    check_params(AttentionParams(normalizer=req.normalizer, alpha=req.alpha, causal=req.causal_alignment))
    key_lengths = None if req.key_lengths is None else np.asarray(req.key_lengths, dtype=np.int64)
    points = sweep_points(head_dims, req.scales, req.temperatures)
    per_dim = len(points) // len(head_dims)
    dims = Dims(B=B, Hq=H, Hkv=Hkv, L=L, S=S, E=max(head_dims), Ev=max(head_dims))
    flops, size = budget.analyze_estimate(dims, head_dims, per_dim, req.normalizer, req.alpha, drawn)
    budget.enforce(v1._budget(runtime), flops, size, budget.analyze_memory(dims, head_dims, size))
    t1 = time.perf_counter()
    margin = runtime.settings.diag_saturation_margin
    rows = []
    for e in head_dims:
        if drawn:
            query, key = draw_normal((B, H, L, e), req.seed)
        assert query is not None and key is not None
        rows += analyze(
            query,
            key,
            points=[pt for pt in points if pt.head_dim == e],
            normalizer=req.normalizer,
            alpha=req.alpha,
            mask=mask,
            causal=req.causal_alignment,
            key_lengths=key_lengths,
            vanishing_threshold=req.vanishing_threshold,
            saturation_margin=margin,
        )
    t2 = time.perf_counter()
    return {
        "sweep": [r.as_dict() for r in rows],
        "normalizer": req.normalizer,
        "shape": [B, H, L, S],
        "kv_heads": Hkv,
        "seed": req.seed if drawn else None,
        "vanishing_threshold": req.vanishing_threshold,
        "saturation_margin": margin,
        "timing_ms": v1._timing(start=t0, decode=t1, compute=t2),
    }


def decode_mask(value: Any, limits: codecs.TensorLimits) -> np.ndarray:
    """A mask as /v1/attention takes it: boolean, or float (finite or -inf) in float64."""
    mask = v1.decode_tensor(value, "mask", kind="mask", limits=limits)
    as_float = v1._float_mask_as(mask, np.dtype(np.float64))
    assert as_float is not None  # None only for a missing mask
    return as_float


@router.post(
    "/attention/analyze",
    response_model=AnalyzeResponse,
    responses=v1.PROBLEM_RESPONSES,
    summary="Training-health analysis: a sweep over scales, temperatures and head dimensions",
    openapi_extra=v1._json_body("AnalyzeRequest"),
)
async def post_attention_analyze(request: Request) -> Response:
    """Score spread, entropy, saturation and the normalizer's Jacobian norm for each scale, temperature and (when Q
    and K are drawn from `shape`) head dimension: what the 1/sqrt(d_k) scale and the temperature do to gradients.
    """
    raw = await read_body(request)
    return await run_cpu(request, len(raw), _analyze_response, request.app.state.runtime, raw)


def _analyze_response(runtime: Runtime, raw: bytes) -> Response:
    req = v1._validate(AnalyzeRequest, parse_json_object(raw, ANALYZE_TENSORS))
    return json_response(compute_analyze(runtime, req))
