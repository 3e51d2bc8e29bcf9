"""``POST /v1/attention``, ``/v1/attention/backward`` and ``/v1/attention/analyze``: decode the JSON body, call
the data plane, encode the answer.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import numpy as np
from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response

from service.core.types import AttentionInputs
from service.dataplane import analysis as analysis_op
from service.dataplane import attention as attention_op
from service.dataplane import backward as backward_op
from service.dataplane.context import Context
from service.dataplane.errors import invalid
from service.dataplane.plane import DataPlane
from service.dataplane.scheduling import Job
from service.dataplane.tensors import TensorLimits, float_mask_as
from service.dataplane.timing import Timing
from service.http.codecs.tensors import encode_tensor
from service.http.responses import json_bytes
from service.http.v1.common import Route, answer, json_route, optional_tensor, parsed, tensor
from service.http.v1.gradient_schemas import (
    AnalyzeRequest,
    AnalyzeResponse,
    AttentionBackwardRequest,
    AttentionBackwardResponse,
)
from service.http.v1.schemas import AttentionFields, AttentionRequest, AttentionResponse

ATTENTION_TENSORS = ("query", "key", "value", "mask")
BACKWARD_TENSORS = (*ATTENTION_TENSORS, "grad_output", "grad_weights")
ANALYZE_TENSORS = ("query", "key", "mask")


def attention_inputs(req: AttentionFields, limits: TensorLimits) -> AttentionInputs:
    """The tensors of a /v1/attention (or backward) body, decoded in the order the contract checks them."""
    return AttentionInputs(
        query=tensor(req.query, "query", limits),
        key=tensor(req.key, "key", limits),
        value=tensor(req.value, "value", limits),
        mask=optional_tensor(req.mask, "mask", limits, "mask"),
        key_lengths=None if req.key_lengths is None else np.asarray(req.key_lengths, dtype=np.int64),
    )


def engine_body(out: attention_op.AttentionOutcome | backward_op.BackwardOutcome) -> dict[str, str]:
    return {"name": out.engine.name, "provider": out.engine.provider, "reason": out.engine.reason}


def attention_body(out: attention_op.AttentionOutcome, returned: Collection[str], encoding: str) -> bytes:
    body: dict[str, Any] = {}
    if "output" in returned:
        body["output"] = encode_tensor(out.output, encoding)
    if out.weights is not None:
        body["weights"] = encode_tensor(out.weights, encoding)
    if out.scores is not None:
        body["scores"] = encode_tensor(out.scores, encoding)
    out.timing.phase("encode")
    if out.diagnostics is not None:
        body["diagnostics"] = out.diagnostics
    if out.gradient_health is not None:
        body["gradient_health"] = out.gradient_health
    if out.inspection is not None:
        body["inspection"] = out.inspection
    if out.norm_weights is not None:
        body["norm_weights"] = encode_tensor(out.norm_weights, encoding)
    body["engine"] = engine_body(out)
    body["timing_ms"] = out.timing.ms(attention_op.TIMING_ORDER)
    return json_bytes(body)


def backward_body(out: backward_op.BackwardOutcome, encoding: str) -> bytes:
    result, want = out.result, out.want
    body: dict[str, Any] = {}
    for name in backward_op.TENSOR_RESULTS:
        arr = getattr(result, name)
        if name in want and arr is not None:
            body[name] = encode_tensor(arr, encoding)
    for name in ("grad_scale", "grad_temperature"):
        if name in want:
            body[name] = getattr(result, name)
    if "gradient_health" in want and result.gradient_health is not None:
        health = result.gradient_health
        body["gradient_health"] = {"threshold": health.threshold, "heads": health.heads()}
    if out.head_importance is not None:
        body["head_importance"] = encode_tensor(out.head_importance, encoding)
    out.timing.phase("encode")
    body["engine"] = engine_body(out)
    body["timing_ms"] = out.timing.ms(backward_op.TIMING_ORDER)
    return json_bytes(body)


def analysis_body(out: analysis_op.AnalysisOutcome) -> bytes:
    return json_bytes(
        {
            "sweep": [row.as_dict() for row in out.sweep],
            "normalizer": out.normalizer,
            "shape": out.shape,
            "kv_heads": out.kv_heads,
            "seed": out.seed,
            "vanishing_threshold": out.vanishing_threshold,
            "saturation_margin": out.saturation_margin,
            "timing_ms": out.timing.ms(analysis_op.TIMING_ORDER),
        }
    )


@dataclass(frozen=True, slots=True)
class Decoded:
    """A /v1/attention or backward body: its validated fields and its tensors, as the contract checks them."""

    req: AttentionRequest
    inputs: AttentionInputs


def decode_attention(ctx: Context, raw: bytes) -> Decoded:
    req = parsed(AttentionRequest, raw, ATTENTION_TENSORS)
    return Decoded(req, attention_inputs(req, ctx.limits))


def run_attention(ctx: Context, d: Decoded, timing: Timing) -> Job[attention_op.AttentionOutcome]:
    req = d.req
    returned = frozenset(req.return_)
    inspection = attention_op.InspectionRequest(
        sink_positions=req.sink_positions,
        token_ids=None if req.token_ids is None else token_ids(req.token_ids),
        exclude_bos=req.exclude_bos,
        exclude_current_token=req.exclude_current_token,
    )
    return attention_op.attention(
        ctx,
        d.inputs,
        req,
        precision=req.precision,
        returned=returned,
        encoding=req.encoding,
        timing=timing,
        inspection=inspection,
    )


def token_ids(rows: list[list[int]]) -> np.ndarray:
    """``token_ids`` as an int64 ``(B, S)`` array: rows of one length, or a 422 naming the field."""
    if len({len(row) for row in rows}) > 1:
        raise invalid("token_ids must be rectangular: every row has S token ids", "token_ids")
    return np.asarray(rows, dtype=np.int64)


def encode_attention(d: Decoded, out: attention_op.AttentionOutcome) -> bytes:
    return attention_body(out, frozenset(d.req.return_), d.req.encoding)


@dataclass(frozen=True, slots=True)
class DecodedBackward:
    req: AttentionBackwardRequest
    inputs: AttentionInputs
    grad_output: np.ndarray
    grad_weights: np.ndarray | None


def decode_backward(ctx: Context, raw: bytes) -> DecodedBackward:
    req = parsed(AttentionBackwardRequest, raw, BACKWARD_TENSORS)
    limits = ctx.limits
    inputs = attention_inputs(req, limits)
    grad_output = tensor(req.grad_output, "grad_output", limits)
    return DecodedBackward(req, inputs, grad_output, optional_tensor(req.grad_weights, "grad_weights", limits))


def run_backward(ctx: Context, d: DecodedBackward, timing: Timing) -> Job[backward_op.BackwardOutcome]:
    req = d.req
    returned = list(req.return_)
    return backward_op.backward(
        ctx,
        d.inputs,
        d.grad_output,
        d.grad_weights,
        req,
        precision=req.precision,
        returned=returned,
        encoding=req.encoding,
        timing=timing,
        grad_mask_loc=("return", returned.index("grad_mask")) if "grad_mask" in returned else ("return",),
    )


@dataclass(frozen=True, slots=True)
class DecodedAnalysis:
    req: AnalyzeRequest
    query: np.ndarray | None
    key: np.ndarray | None
    mask: np.ndarray | None


def decode_analysis(ctx: Context, raw: bytes) -> DecodedAnalysis:
    req = parsed(AnalyzeRequest, raw, ANALYZE_TENSORS)
    limits = ctx.limits
    # The mask first: an invalid one is refused even when the drawn shape is also too large.
    mask = float_mask_as(optional_tensor(req.mask, "mask", limits, "mask"), np.dtype(np.float64))
    analysis_op.check_sources(req, req.query is not None, req.key is not None)
    query = optional_tensor(req.query, "query", limits)
    key = optional_tensor(req.key, "key", limits)
    return DecodedAnalysis(req, query, key, mask)


def run_analysis(ctx: Context, d: DecodedAnalysis, timing: Timing) -> Job[analysis_op.AnalysisOutcome]:
    return analysis_op.analysis(ctx, d.req, d.query, d.key, d.mask, timing=timing)


ATTENTION = Route("/v1/attention", decode_attention, run_attention, encode_attention)
ATTENTION_BACKWARD = Route(
    "/v1/attention/backward", decode_backward, run_backward, lambda d, out: backward_body(out, d.req.encoding)
)
ATTENTION_ANALYZE = Route("/v1/attention/analyze", decode_analysis, run_analysis, lambda d, out: analysis_body(out))
"""The routes as operations of the data plane's door."""


def routes(plane: DataPlane) -> list[APIRoute]:
    """The attention routes of /v1, bound to ``plane``."""

    async def post_attention(request: Request) -> Response:
        """Scaled dot-product attention with masks, temperature and a choice of normalizer.

        Pipeline: `scores = scale * Q K^T`, plus the mask bias, divided by the temperature, normalized
        over the keys, then `output = A V`. Fully masked rows give zeros.
        """
        return await answer(plane, request, ATTENTION)

    async def post_attention_backward(request: Request) -> Response:
        """The gradients of `sum(output * grad_output) + sum(weights * grad_weights)` with respect to query, key and
        value, and on request the float mask, the scale and the temperature.

        Takes every /v1/attention field. Masked positions get exactly zero gradient; fully masked rows give zeros.
        """
        return await answer(plane, request, ATTENTION_BACKWARD)

    async def post_attention_analyze(request: Request) -> Response:
        """Score spread, entropy, saturation and the normalizer's Jacobian norm for each scale, temperature and (when Q
        and K are drawn from `shape`) head dimension: what the 1/sqrt(d_k) scale and the temperature do to gradients.
        """
        return await answer(plane, request, ATTENTION_ANALYZE)

    return [
        json_route(
            "/v1/attention",
            post_attention,
            tag="attention",
            request=AttentionRequest,
            response=AttentionResponse,
            summary="Compute attention",
        ),
        json_route(
            "/v1/attention/backward",
            post_attention_backward,
            tag="gradients",
            request=AttentionBackwardRequest,
            response=AttentionBackwardResponse,
            summary="Gradients of attention (backward pass)",
        ),
        json_route(
            "/v1/attention/analyze",
            post_attention_analyze,
            tag="gradients",
            request=AnalyzeRequest,
            response=AnalyzeResponse,
            summary="Training-health analysis: a sweep over scales, temperatures and head dimensions",
        ),
    ]
