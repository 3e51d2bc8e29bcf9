"""``POST /v1/attention/backward`` (gradients over HTTP) and ``POST /v1/attention/analyze`` (api.md).

Both use the machinery of ``/v1/attention``: the raw body read by
:func:`~service.api.wire.read_body`, the CPU work in :func:`~service.api.wire.run_cpu`,
validation by :func:`service.api.v1._validate`, tensors decoded by
:mod:`service.api.codecs`, a 413 from :mod:`service.api.budget` before anything
large is allocated, and problem+json errors naming the field.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from fastapi import APIRouter, Request
from starlette.responses import Response

from service.api import budget, codecs, v1
from service.api.errors import ProblemError
from service.api.gradient_schemas import AttentionBackwardRequest, AttentionBackwardResponse
from service.api.wire import json_response, parse_json_object, read_body, run_cpu
from service.core.backward import BackwardTask
from service.engines.dispatch import EngineNotReady, EngineUnavailable
from service.runtime import Runtime

router = APIRouter(prefix="/v1", tags=["gradients"])

TENSOR_RESULTS = ("grad_query", "grad_key", "grad_value", "grad_mask", "output", "weights")


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


def compute_backward(runtime: Runtime, req: AttentionBackwardRequest) -> dict[str, Any]:
    """The response body of one backward request (arrays not yet serialized)."""
    t0 = time.perf_counter()
    bt = build_backward_task(req, runtime)
    t1 = time.perf_counter()
    try:
        result, choice = runtime.dispatcher.run_backward(bt, req.engine)
    except EngineUnavailable as exc:
        raise _invalid(str(exc), ["engine"]) from None
    except EngineNotReady as exc:
        raise ProblemError(503, str(exc), headers={"Retry-After": "5"}) from None
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
    req = v1._validate(AttentionBackwardRequest, parse_json_object(raw))
    return json_response(compute_backward(runtime, req))
