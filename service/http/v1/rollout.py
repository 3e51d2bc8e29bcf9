"""``POST /v1/attention/rollout``: decode the JSON body, call the data plane, encode the answer."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response

from service.dataplane import rollout as rollout_op
from service.dataplane.context import Context
from service.dataplane.plane import DataPlane
from service.dataplane.scheduling import Job
from service.dataplane.tensors import stack_limits
from service.dataplane.timing import Timing
from service.http.codecs.tensors import encode_tensor
from service.http.responses import json_bytes
from service.http.v1.common import Route, answer, json_route, optional_tensor, parsed, tensor
from service.http.v1.rollout_schemas import RolloutRequest, RolloutResponse

TENSORS = ("weights", "gradients")
"""Top-level fields decoded straight into numpy from large bodies."""


@dataclass(frozen=True, slots=True)
class Decoded:
    """A rollout body: its validated fields and its tensors."""

    req: RolloutRequest
    weights: np.ndarray
    gradients: np.ndarray | None


def decode(ctx: Context, raw: bytes) -> Decoded:
    req = parsed(RolloutRequest, raw, TENSORS)
    limits = stack_limits(ctx.limits)
    return Decoded(req, tensor(req.weights, "weights", limits), optional_tensor(req.gradients, "gradients", limits))


def run(ctx: Context, d: Decoded, timing: Timing) -> Job[rollout_op.RolloutOutcome]:
    req = d.req
    return rollout_op.rollout(
        ctx,
        d.weights,
        d.gradients,
        req.rows,
        req,
        sent_as=d.weights.dtype,
        precision=req.precision,
        encoding=req.encoding,
        timing=timing,
        whole=req.top_k is None,
    )


def body(out: rollout_op.RolloutOutcome, encoding: str) -> bytes:
    parts = {"rollout": out.rollout, "top_keys": out.top_keys, "top_values": out.top_values}
    encoded = {name: encode_tensor(arr, encoding) for name, arr in parts.items() if arr is not None}
    out.timing.phase("encode")
    return json_bytes({**encoded, "timing_ms": out.timing.ms(rollout_op.TIMING_ORDER)})


ROLLOUT = Route("/v1/attention/rollout", decode, run, lambda d, out: body(out, d.req.encoding))
"""The route as an operation of the data plane's door."""


def routes(plane: DataPlane) -> list[APIRoute]:
    """The rollout route of /v1, bound to ``plane``."""

    async def post_attention_rollout(request: Request) -> Response:
        """Attention rollout across layers (Abnar and Zuidema 2020): each layer's weights fused over the heads
        (mean, max or min; with `gradients`, the mean of relu(grad * A), Chefer et al. 2021), the lowest
        `discard_ratio` of each fused matrix set to 0, mixed with the identity (`residual`) and renormalised by rows,
        then multiplied, last layer first. `rows` asks for only those rows of the answer, `top_k` for only each
        row's k largest entries and their key indices.
        """
        return await answer(plane, request, ROLLOUT)

    return [
        json_route(
            "/v1/attention/rollout",
            post_attention_rollout,
            tag="attention",
            request=RolloutRequest,
            response=RolloutResponse,
            summary="Attention rollout across layers (and its gradient-weighted form)",
        )
    ]
