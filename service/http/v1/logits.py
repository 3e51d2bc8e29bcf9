"""``POST /v1/softmax``, ``/v1/sample`` and ``/v1/calibrate``: decode the JSON body, call the data plane, encode
the answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import numpy as np
from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response

from service.dataplane import logits as logits_op
from service.dataplane import sampling as sampling_op
from service.dataplane.context import Context
from service.dataplane.plane import DataPlane
from service.dataplane.scheduling import Job
from service.dataplane.timing import Timing
from service.http.codecs.tensors import encode_tensor
from service.http.responses import json_bytes
from service.http.v1.common import Route, answer, json_route, optional_tensor, parsed, tensor
from service.http.v1.logits_schemas import CalibrateRequest, CalibrateResponse, SampleRequest, SampleResponse
from service.http.v1.schemas import SoftmaxRequest, SoftmaxResponse

R = TypeVar("R")

TENSORS = ("logits", "mask")
"""Top-level fields decoded straight into numpy from large bodies."""


def softmax_body(out: logits_op.SoftmaxOutcome, encoding: str) -> bytes:
    body: dict[str, Any] = {"probabilities": encode_tensor(out.probabilities, encoding)}
    if out.log_probabilities is not None:
        body["log_probabilities"] = encode_tensor(out.log_probabilities, encoding)
    body["diagnostics"] = out.diagnostics
    body["timing_ms"] = out.timing.ms(logits_op.SOFTMAX_TIMING_ORDER)
    return json_bytes(body)


def sample_body(out: sampling_op.SampleOutcome, encoding: str) -> bytes:
    body: dict[str, Any] = {}
    for name in ("tokens", "logprobs", "raw_logprobs"):
        arr = getattr(out, name)
        if arr is not None:
            body[name] = encode_tensor(arr, encoding)
    if out.top_logprobs is not None:
        body["top_logprobs"] = out.top_logprobs
    if out.probabilities is not None:
        body["probabilities"] = encode_tensor(out.probabilities, encoding)
    if out.diagnostics is not None:
        body["diagnostics"] = out.diagnostics
    body["seed"] = out.seed
    out.timing.phase("encode")
    body["timing_ms"] = out.timing.ms(sampling_op.TIMING_ORDER)
    return json_bytes(body)


def calibrate_body(out: logits_op.CalibrateOutcome) -> bytes:
    return json_bytes(
        {
            "temperature": out.temperature,
            "nll": {"before": out.nll_before, "after": out.nll_after},
            "ece": {"before": out.ece_before, "after": out.ece_after},
            "accuracy": out.accuracy,
            "reliability": {"before": out.reliability_before, "after": out.reliability_after},
            "bounded": out.bounded,
            "timing_ms": out.timing.ms(logits_op.CALIBRATE_TIMING_ORDER),
        }
    )


@dataclass(frozen=True, slots=True)
class Decoded(Generic[R]):
    """A /v1 logits body: its validated fields, its logits and its mask."""

    req: R
    logits: np.ndarray
    mask: np.ndarray | None = None


def decode_softmax(ctx: Context, raw: bytes) -> Decoded[SoftmaxRequest]:
    req = parsed(SoftmaxRequest, raw, TENSORS)
    logits = tensor(req.logits, "logits", ctx.limits, "logits")
    return Decoded(req, logits, optional_tensor(req.mask, "mask", ctx.limits, "mask"))


def run_softmax(ctx: Context, d: Decoded[SoftmaxRequest], timing: Timing) -> Job[logits_op.SoftmaxOutcome]:
    req = d.req
    return logits_op.softmax(ctx, d.logits, d.mask, req, precision=req.precision, encoding=req.encoding, timing=timing)


def decode_sample(ctx: Context, raw: bytes) -> Decoded[SampleRequest]:
    req = parsed(SampleRequest, raw, TENSORS)
    limits = ctx.logits_limits
    logits = tensor(req.logits, "logits", limits, "logits")
    return Decoded(req, logits, optional_tensor(req.mask, "mask", limits, "mask"))


def run_sample(ctx: Context, d: Decoded[SampleRequest], timing: Timing) -> Job[sampling_op.SampleOutcome]:
    req = d.req
    return sampling_op.sample(
        ctx,
        d.logits,
        d.mask,
        req.previous_tokens,
        req,
        precision=req.precision,
        returned=req.return_,
        encoding=req.encoding,
        timing=timing,
    )


def decode_calibrate(ctx: Context, raw: bytes) -> Decoded[CalibrateRequest]:
    req = parsed(CalibrateRequest, raw, TENSORS)
    return Decoded(req, tensor(req.logits, "logits", ctx.logits_limits))


def run_calibrate(ctx: Context, d: Decoded[CalibrateRequest], timing: Timing) -> Job[logits_op.CalibrateOutcome]:
    return logits_op.calibrate(ctx, d.logits, np.asarray(d.req.labels), d.req, timing=timing)


SOFTMAX = Route("/v1/softmax", decode_softmax, run_softmax, lambda d, out: softmax_body(out, d.req.encoding))
SAMPLE = Route("/v1/sample", decode_sample, run_sample, lambda d, out: sample_body(out, d.req.encoding))
CALIBRATE = Route("/v1/calibrate", decode_calibrate, run_calibrate, lambda d, out: calibrate_body(out))
"""The routes as operations of the data plane's door."""


def routes(plane: DataPlane) -> list[APIRoute]:
    """The logits routes of /v1, bound to ``plane``."""

    async def post_softmax(request: Request) -> Response:
        """Softmax (optionally with log-probabilities), sparsemax, entmax or ReLU normalization of a logits tensor."""
        return await answer(plane, request, SOFTMAX)

    async def post_sample(request: Request) -> Response:
        """Masks, repetition/frequency/presence penalties, temperature (0 = greedy), top-k, top-p and min-p, in
        that order, then `n` draws per row from the final distribution with a Philox generator seeded by
        `seed` (drawn by the server and returned when absent): the same request and seed give the same tokens.
        """
        return await answer(plane, request, SAMPLE)

    async def post_calibrate(request: Request) -> Response:
        """Temperature scaling (Guo et al. 2017): the T in [0.01, 100] that minimises the mean NLL of the labels,
        with NLL, expected calibration error and reliability bins before (T = 1) and after.
        """
        return await answer(plane, request, CALIBRATE)

    return [
        json_route(
            "/v1/softmax",
            post_softmax,
            tag="attention",
            request=SoftmaxRequest,
            response=SoftmaxResponse,
            summary="Normalize logits along an axis",
        ),
        json_route(
            "/v1/sample",
            post_sample,
            tag="logits",
            request=SampleRequest,
            response=SampleResponse,
            summary="Sample tokens from logits (temperature, top-k, top-p, min-p, penalties)",
        ),
        json_route(
            "/v1/calibrate",
            post_calibrate,
            tag="logits",
            request=CalibrateRequest,
            response=CalibrateResponse,
            summary="Fit a temperature to labelled logits (temperature scaling)",
        ),
    ]
