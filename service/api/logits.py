"""``POST /v1/sample`` and ``POST /v1/calibrate``: decisions from final-layer logits (api.md).

Both routes work like ``/v1/softmax``: the raw body is read with :func:`read_body`, parsed and
validated in :func:`run_cpu`'s worker, tensors decoded by :mod:`service.api.codecs`, the budget
checked before anything large is allocated, and the maths done by :mod:`service.core.sampling` and
:mod:`service.core.calibration` (pure numpy).
"""

from __future__ import annotations

import secrets
import time
from typing import Any

import numpy as np
from fastapi import APIRouter, Request
from starlette.responses import Response

from service.api import budget, codecs, v1
from service.api.errors import ProblemError
from service.api.logits_schemas import (
    SERVER_SEED_BITS,
    CalibrateRequest,
    CalibrateResponse,
    SampleRequest,
    SampleResponse,
)
from service.api.wire import json_response, parse_json_object, read_body, run_cpu
from service.core import calibration, sampling
from service.runtime import Runtime

router = APIRouter(prefix="/v1", tags=["logits"])

TENSORS = ("logits", "mask")
"""Top-level fields decoded straight into numpy from large bodies (``parse_json_object``)."""


def logits_limits(runtime: Runtime) -> codecs.TensorLimits:
    """Limits of sample and calibrate logits: rank 1 or 2, any axis up to ``max_vocab`` (a 256k vocabulary)."""
    s = runtime.settings
    return codecs.TensorLimits(max_rank=2, max_dim=max(s.max_dim, s.max_vocab), max_elements=s.max_tensor_elements)


def _invalid(msg: str, *loc: str | int) -> ProblemError:
    return ProblemError(422, msg, errors=[{"loc": list(loc), "msg": msg}])


def params_of(req: SampleRequest) -> sampling.SamplingParams:
    return sampling.SamplingParams(
        temperature=req.temperature,
        top_k=req.top_k,
        top_p=req.top_p,
        min_p=req.min_p,
        repetition_penalty=req.repetition_penalty,
        presence_penalty=req.presence_penalty,
        frequency_penalty=req.frequency_penalty,
    )


def _per_row(arr: np.ndarray, rank: int) -> Any:
    """A per-row array as the response carries it: a scalar for (V,) logits, a list for (N, V)."""
    return arr[0].item() if rank == 1 else arr


def compute_sample(
    runtime: Runtime, req: SampleRequest, previous_tokens: sampling.TokenLists | None = None
) -> dict[str, Any]:
    """The /v1/sample response body (tensors as arrays, or their b64 form); /v2 passes its own token array."""
    t0 = time.perf_counter()
    limits = logits_limits(runtime)
    logits = v1.decode_tensor(req.logits, "logits", kind="logits", limits=limits)
    if logits.ndim == 2 and logits.shape[0] > runtime.settings.max_dim:
        raise _invalid(
            f"logits has {logits.shape[0]} rows, above the limit of {runtime.settings.max_dim}", "logits", "shape", 0
        )
    dtype = np.dtype(req.precision)
    logits = codecs.cast_checked(logits, dtype, "logits")
    codecs.check_finite(logits, "logits")
    mask = None if req.mask is None else v1.decode_tensor(req.mask, "mask", kind="mask", limits=limits)
    mask = v1._float_mask_as(mask, dtype)
    rows, vocab = (1, logits.shape[0]) if logits.ndim == 1 else logits.shape
    returned = set(req.return_)
    sorts_all = req.top_p < 1 and not 0 < req.top_k < vocab and req.temperature > 0
    flops, size, memory = budget.sample_estimate(
        rows, vocab, req.n, req.top_logprobs, returned, sorts_all, req.precision, req.encoding
    )
    budget.enforce(v1._budget(runtime), flops, size, memory)
    t1 = time.perf_counter()
    prev = previous_tokens if previous_tokens is not None else req.previous_tokens
    raw: sampling.RawStats | None = None
    if "raw_logprobs" in returned or "diagnostics" in returned:
        raw = sampling.raw_stats(np.atleast_2d(logits))
    filtered, _ = sampling.process(
        logits,
        params_of(req),
        mask=mask,
        previous_tokens=prev,
        dtype=dtype,
        removed_mass="diagnostics" in returned,
        raw=raw,
    )
    seed = req.seed if req.seed is not None else secrets.randbits(SERVER_SEED_BITS)
    tokens, logprobs = sampling.draw(filtered, sampling.uniforms(seed, (rows, req.n)))
    t2 = time.perf_counter()

    enc = req.encoding
    shape = (req.n,) if logits.ndim == 1 else (rows, req.n)
    body: dict[str, Any] = {}
    if "tokens" in returned:
        body["tokens"] = codecs.encode_tensor(tokens.reshape(shape), enc)
    if "logprobs" in returned:
        body["logprobs"] = codecs.encode_tensor(logprobs.astype(dtype).reshape(shape), enc)
    if "raw_logprobs" in returned:
        assert raw is not None
        picked = np.take_along_axis(np.atleast_2d(logits), tokens, axis=-1).astype(np.float64)
        raw_lp = picked - raw.max[:, None] - raw.lse[:, None]
        body["raw_logprobs"] = codecs.encode_tensor(raw_lp.astype(dtype).reshape(shape), enc)
    if "top_logprobs" in returned:
        body["top_logprobs"] = _top_logprobs(filtered, req.top_logprobs, logits.ndim)
    if "probabilities" in returned:
        body["probabilities"] = codecs.encode_tensor(filtered.dense(dtype).reshape(logits.shape), enc)
    if "diagnostics" in returned:
        assert raw is not None
        body["diagnostics"] = {
            "entropy_raw": _per_row(raw.entropy, logits.ndim),
            "entropy": _per_row(filtered.entropy, logits.ndim),
            "kept": _per_row(filtered.kept.astype(np.int64), logits.ndim),
            "removed_mass": _per_row(filtered.removed_mass + 0.0, logits.ndim),
        }
    body["seed"] = seed
    t3 = time.perf_counter()
    body["timing_ms"] = v1._timing(start=t0, decode=t1, compute=t2, encode=t3)
    return body


def _top_logprobs(filtered: sampling.Filtered, m: int, rank: int) -> Any:
    """Per row, the m most probable tokens of the final distribution as ``[{"token", "logprob"}, ...]``."""
    if m == 0:
        lists: list[list[dict[str, Any]]] = [[] for _ in range(filtered.ids.shape[0])]
    else:
        ids, logp, valid = sampling.top_logprobs(filtered, m)
        # Log-probabilities stay numpy scalars: orjson writes a float32 with its own shortest digits.
        lists = [
            [{"token": t, "logprob": lp} for t, lp, ok in zip(ti, li, vi, strict=True) if ok]
            for ti, li, vi in zip(ids.tolist(), logp, valid.tolist(), strict=True)
        ]
    return lists[0] if rank == 1 else lists


@router.post(
    "/sample",
    response_model=SampleResponse,
    responses=v1.PROBLEM_RESPONSES,
    summary="Sample tokens from logits (temperature, top-k, top-p, min-p, penalties)",
    openapi_extra=v1._json_body("SampleRequest"),
)
async def post_sample(request: Request) -> Response:
    """Masks, repetition/frequency/presence penalties, temperature (0 = greedy), top-k, top-p and min-p, in
    that order (semantics.md), then `n` draws per row from the final distribution with a Philox generator
    seeded by `seed` (drawn by the server and returned when absent): the same request and seed give the
    same tokens.
    """
    raw = await read_body(request)
    return await run_cpu(request, len(raw), _sample_response, v1._runtime(request), raw)


def _sample_response(runtime: Runtime, raw: bytes) -> Response:
    return json_response(compute_sample(runtime, v1._validate(SampleRequest, parse_json_object(raw, TENSORS))))


def compute_calibrate(runtime: Runtime, req: CalibrateRequest, labels: np.ndarray | None = None) -> dict[str, Any]:
    """The /v1/calibrate response body; /v2 passes its labels as an array."""
    t0 = time.perf_counter()
    logits = v1.decode_tensor(req.logits, "logits", kind="float", limits=logits_limits(runtime))
    y = np.asarray(req.labels if labels is None else labels)
    if y.size == 0:
        raise _invalid("labels is empty (N = 0): nothing to calibrate", "labels")
    if y.dtype.kind not in "iu":
        y = y.astype(np.int64)
    flops, size, memory = budget.calibrate_estimate(logits.shape[0], logits.shape[1], req.bins)
    budget.enforce(v1._budget(runtime), flops, size, memory)
    logits = codecs.cast_checked(logits, np.dtype(np.float64), "logits")
    codecs.check_finite(logits, "logits")
    t1 = time.perf_counter()
    result = calibration.calibrate(logits, y, req.bins)
    t2 = time.perf_counter()
    return {
        "temperature": result.fit.temperature,
        "nll": {"before": result.nll_before, "after": result.nll_after},
        "ece": {"before": result.before.ece, "after": result.after.ece},
        "accuracy": result.before.accuracy,
        "reliability": {"before": result.before.bins(), "after": result.after.bins()},
        "bounded": result.fit.bounded,
        "timing_ms": v1._timing(start=t0, decode=t1, compute=t2),
    }


@router.post(
    "/calibrate",
    response_model=CalibrateResponse,
    responses=v1.PROBLEM_RESPONSES,
    summary="Fit a temperature to labelled logits (temperature scaling)",
    openapi_extra=v1._json_body("CalibrateRequest"),
)
async def post_calibrate(request: Request) -> Response:
    """Temperature scaling (Guo et al. 2017): the T in [0.01, 100] that minimises the mean NLL of the labels,
    with NLL, expected calibration error and reliability bins before (T = 1) and after.
    """
    raw = await read_body(request)
    return await run_cpu(request, len(raw), _calibrate_response, v1._runtime(request), raw)


def _calibrate_response(runtime: Runtime, raw: bytes) -> Response:
    return json_response(compute_calibrate(runtime, v1._validate(CalibrateRequest, parse_json_object(raw, TENSORS))))
