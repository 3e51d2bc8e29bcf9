"""``POST /v1/softmax``, ``/v1/sample`` and ``/v1/calibrate``: decode the JSON body, call the data plane, encode
the answer.
"""

from __future__ import annotations

from typing import Any

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
from service.http.bodies import json_bytes
from service.http.codecs.tensors import encode_tensor
from service.http.v1.common import Route, answer, json_route, optional_tensor, parsed, tensor
from service.http.v1.logits_schemas import CalibrateRequest, CalibrateResponse, SampleRequest, SampleResponse
from service.http.v1.schemas import SoftmaxRequest, SoftmaxResponse

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


def softmax_job(ctx: Context, raw: bytes) -> Job[bytes]:
    """The work of one /v1/softmax request: its body parsed and checked, its answer as JSON."""
    req = parsed(SoftmaxRequest, raw, TENSORS)
    timing = Timing()
    logits = tensor(req.logits, "logits", ctx.limits, "logits")
    mask = optional_tensor(req.mask, "mask", ctx.limits, "mask")
    job = logits_op.softmax(ctx, logits, mask, req, precision=req.precision, encoding=req.encoding, timing=timing)
    return job.then(lambda out: softmax_body(out, req.encoding))


def sample_job(ctx: Context, raw: bytes) -> Job[bytes]:
    """The work of one /v1/sample request: its body parsed and checked, its answer as JSON."""
    req = parsed(SampleRequest, raw, TENSORS)
    timing = Timing()
    limits = ctx.logits_limits
    job = sampling_op.sample(
        ctx,
        tensor(req.logits, "logits", limits, "logits"),
        optional_tensor(req.mask, "mask", limits, "mask"),
        req.previous_tokens,
        req,
        precision=req.precision,
        returned=req.return_,
        encoding=req.encoding,
        timing=timing,
    )
    return job.then(lambda out: sample_body(out, req.encoding))


def calibrate_job(ctx: Context, raw: bytes) -> Job[bytes]:
    """The work of one /v1/calibrate request: its body parsed and checked, its answer as JSON."""
    req = parsed(CalibrateRequest, raw, TENSORS)
    timing = Timing()
    logits = tensor(req.logits, "logits", ctx.logits_limits)
    return logits_op.calibrate(ctx, logits, np.asarray(req.labels), req, timing=timing).then(calibrate_body)


SOFTMAX = Route("/v1/softmax", softmax_job)
SAMPLE = Route("/v1/sample", sample_job)
CALIBRATE = Route("/v1/calibrate", calibrate_job)
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
