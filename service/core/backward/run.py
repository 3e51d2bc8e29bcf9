"""The backward pass on numpy, on the forward pass's prepared call and chunks of query rows."""

from __future__ import annotations

import math
import threading
from concurrent.futures import Executor
from dataclasses import replace

import numpy as np

from service.core import normalizers
from service.core.attention.chunks import (
    Chunk,
    chunk_keep,
    chunk_rows,
    chunk_scores,
    chunk_valid,
    mask_chunk,
    relu_scores,
    run_chunks,
)
from service.core.attention.numerics import check_live_rows, check_scores_finite, not_finite_error
from service.core.attention.prepared import mask5, prepare, split_heads
from service.core.backward.health import gradient_health, jacobian_norms
from service.core.backward.task import BACKWARD_RETURNS, BackwardResult, BackwardTask, checked_gradient, sum_to_shape
from service.core.errors import InvalidInput
from service.core.masks import as_4d_mask


def _relu_scale_gradient(dy: np.ndarray, bias: np.ndarray | None, scale: float) -> float:
    """The ReLU ``grad_scale = sum(dY * Q K^T)`` for ``Y = scale * Q K^T + bias``, as ``-sum(dY * bias) / scale``.

    The relu weights are homogeneous of degree 0 in ``Y``, so ``sum(dY * Y) = 0`` (Euler's theorem, as for
    ``grad_temperature``): without a bias the answer is exactly 0, not the rounding left of cancelling sums.
    Masked positions (bias ``-inf``) have ``dY = 0`` and add nothing.
    """
    if bias is None:
        return 0.0
    return -float(np.sum(np.where(dy != 0, dy * bias, 0.0), dtype=np.float64)) / scale


def run_backward(bt: BackwardTask, *, executor: Executor | None = None, workers: int = 1) -> BackwardResult:
    """The backward pass of :func:`service.core.attention.run_attention` on numpy (:mod:`service.core.backward`).

    Chunks of query rows run on ``executor`` (``workers`` threads) for large
    requests, as in the forward pass; key and value gradients, the mask gradient
    and the scalar sums are added up under a lock. Raises :class:`InvalidInput`
    for inputs the contract rejects (``grad_mask`` without a float mask, a
    gradient of the wrong shape) and :class:`NumericalError` when a gradient is
    not finite (float32 overflow: retry in float64).
    """
    task = bt.task
    params = task.params
    unknown = set(bt.want) - set(BACKWARD_RETURNS)
    if unknown:
        raise InvalidInput(
            f"unknown return values {sorted(unknown)}; choose from {', '.join(BACKWARD_RETURNS)}", ("return",)
        )
    want = bt.want
    # relu's weights do not depend on the temperature: compute at T = 1 (the package docstring)
    temperature_free = params.normalizer == "relu"
    p = prepare(task.inputs, replace(params, temperature=1.0) if temperature_free else params, task.dtype)
    d = p.dims
    dtype = p.q.dtype
    lead = task.inputs.query.shape[:-1]
    go4 = checked_gradient(bt.grad_output, lead + (d.Ev,), "grad_output", "output", dtype)
    gw4 = (
        None
        if bt.grad_weights is None
        else checked_gradient(bt.grad_weights, lead + (d.S,), "grad_weights", "weights", dtype)
    )
    mask = task.inputs.mask
    gm4: np.ndarray | None = None
    if "grad_mask" in want:
        if mask is None or np.asarray(mask).dtype == bool:
            raise InvalidInput("grad_mask needs a float (additive) mask; this request has none", ("mask",))
        gm4 = np.zeros(as_4d_mask(np.asarray(mask), d.weights_shape).shape, dtype=np.float64)
    gm5 = mask5(gm4, d)

    need_dq = bool({"grad_query", "grad_scale"} & want)
    need_dz = need_dq or bool({"grad_key", "grad_mask", "grad_temperature"} & want)
    dq = np.zeros_like(p.q) if need_dq else None
    dk = np.zeros_like(p.k) if "grad_key" in want else None
    dv = np.zeros_like(p.v) if "grad_value" in want else None
    output = np.empty((d.B, d.Hq, d.L, d.Ev), dtype=dtype) if "output" in want else None
    weights = np.empty(d.weights_shape, dtype=dtype) if "weights" in want else None
    norms = np.zeros((d.B, d.Hq, d.L), dtype=np.float64) if "gradient_health" in want else None
    dq5 = None if dq is None else split_heads(dq, d)
    out5 = None if output is None else split_heads(output, d)
    w5 = None if weights is None else split_heads(weights, d)
    go5 = split_heads(go4, d)
    gw5 = None if gw4 is None else split_heads(gw4, d)
    norms5 = None if norms is None else norms.reshape(d.B, d.Hkv, d.group, d.L)
    # scale / T as the scores used it: float64 where it underflows the dtype (numerics.score_factor), so dQ
    # and dK are formed in float64 and rounded once; relu's, with its float64 dZ, is scale (T = 1) itself
    factor = np.float64(p.scale) if temperature_free else p.factor
    normalizer, alpha = params.normalizer, params.alpha
    lock = threading.Lock()
    temperature_sum = [0.0]
    scale_sum = [0.0]  # relu's grad_scale (the others take it from the rounded dQ below)

    def work(c: Chunk) -> None:
        nkv = c.kv.stop - c.kv.start
        ng, nl = c.g.stop - c.g.start, c.l.stop - c.l.start
        with np.errstate(over="ignore", invalid="ignore", under="ignore"):
            v = p.v[c.b, c.kv]
            d_o = chunk_rows(go5, c)
            if temperature_free:
                # relu as in the forward pass: float64 scores (chunks.relu_scores) and weights; its VJP and
                # Jacobian use those, the products with V and dO the weights rounded as the forward returns them
                z = relu_scores(
                    p, p.q5[c.b, c.kv, c.g, c.l], p.k[c.b, c.kv], mask_chunk(p.raw_bias5, c), mask_chunk(p.drop5, c)
                )
                a_exact = normalizers.relu_normalize(z)
                a = a_exact.astype(dtype, copy=False)
            else:
                z = np.empty((nkv, ng * nl, d.S), dtype=dtype)
                chunk_scores(p, c, z)
                # overflow is a NumericalError, as in the forward pass: never a silent dead row
                check_scores_finite(z.reshape(nkv, ng, nl, d.S), chunk_keep(p, c), dtype)
                check_live_rows(np.isneginf(z.max(axis=-1)), chunk_valid(p, c), dtype)
                # softmax runs in place when nothing needs the scores afterwards (the temperature's gradient does)
                in_place = normalizer == "softmax" and "grad_temperature" not in want
                a = a_exact = normalizers.normalize(z, normalizer, alpha=alpha, out=z if in_place else None)
            if out5 is not None:
                np.matmul(a, v, out=chunk_rows(out5, c))
            if w5 is not None:
                chunk_rows(w5, c)[...] = a
            if norms5 is not None:
                chunk_norms = jacobian_norms(normalizer, a_exact, z=z, alpha=alpha).reshape(nkv, ng, nl)
                norms5[c.b, c.kv, c.g, c.l] = chunk_norms * params.temperature if temperature_free else chunk_norms
            dv_part = np.matmul(a.transpose(0, 2, 1), d_o) if dv is not None else None
            dk_part = gm_part = None
            t_part = s_part = 0.0
            if need_dz:
                da = np.matmul(d_o, v.transpose(0, 2, 1))
                if gw5 is not None:
                    da += chunk_rows(gw5, c)
                if normalizer == "softmax":  # dz = a * (da - sum(a * da)), in place in da (finite here)
                    da *= a
                    row = da.sum(axis=-1, keepdims=True)
                    da -= a * row
                    dz = da
                else:
                    dz = normalizers.normalize_backward(normalizer, a_exact, da, alpha=alpha, z=z)
                    dz = dz if temperature_free else dz.astype(dtype, copy=False)  # relu's stays float64
                # the factor scale/T scales the (rows, E) and (S, E) products, not the (rows, S) dZ
                if dq5 is not None:
                    np.multiply(np.matmul(dz, p.k[c.b, c.kv]), factor, out=chunk_rows(dq5, c))
                if temperature_free and "grad_scale" in want:
                    s_part = _relu_scale_gradient(dz.reshape(nkv, ng, nl, d.S), mask_chunk(p.raw_bias5, c), p.scale)
                if dk is not None:
                    dk_part = np.matmul(dz.transpose(0, 2, 1), chunk_rows(p.q5, c))
                    dk_part *= factor
                if "grad_temperature" in want and not temperature_free:
                    t_part = float(np.sum(dz * np.where(np.isneginf(z), 0, z), dtype=np.float64))
                if gm5 is not None:
                    target = mask_chunk(gm5, c)
                    assert target is not None
                    gm_part = sum_to_shape(dz.reshape(nkv, ng, nl, d.S).astype(np.float64), target.shape)
        with lock:
            if dv is not None and dv_part is not None:
                dv[c.b, c.kv] += dv_part
            if dk is not None and dk_part is not None:
                dk[c.b, c.kv] += dk_part
            if gm_part is not None:
                target = mask_chunk(gm5, c)
                assert target is not None
                target += gm_part
            temperature_sum[0] += t_part
            scale_sum[0] += s_part

    run_chunks(d, work, executor, workers)

    T = 1.0 if temperature_free else params.temperature  # the temperature the gradients were computed at
    scale = p.scale  # the request's, or 1/sqrt(E) (prepare)
    result = BackwardResult(valid_keys=p.valid_keys)
    grad_mask = None
    if gm4 is not None and mask is not None:
        with np.errstate(over="ignore"):  # relu's dZ is 1 / sum(relu(Z)): tiny scores overflow float32 here
            grad_mask = (gm4 / T).astype(dtype).reshape(np.asarray(mask).shape)
    for name, arr in (
        ("grad_query", dq),
        ("grad_key", dk),
        ("grad_value", dv),
        ("grad_mask", grad_mask),
        ("output", output),
        ("gradient_health", norms),
    ):
        if arr is not None and not np.isfinite(arr).all():
            raise not_finite_error(
                f"{name} is not finite in {dtype.name}", dtype, ": the scores or gradients overflowed"
            )
    if "grad_query" in want and dq is not None:
        result.grad_query = dq.reshape(task.inputs.query.shape)
    if dk is not None:
        result.grad_key = dk.reshape(task.inputs.key.shape)
    if dv is not None:
        result.grad_value = dv.reshape(task.inputs.value.shape)
    if "grad_scale" in want and dq is not None:
        result.grad_scale = (
            scale_sum[0] if temperature_free else float(np.sum(p.q.astype(np.float64) * dq, dtype=np.float64) / scale)
        )
    if "grad_temperature" in want:
        result.grad_temperature = 0.0 if temperature_free else -temperature_sum[0] / T
    result.grad_mask = grad_mask
    if output is not None:
        result.output = output.reshape(lead + (d.Ev,))
    if weights is not None:
        result.weights = weights.reshape(lead + (d.S,))
    if norms is not None:
        result.gradient_health = gradient_health(norms, p.valid_keys, bt.vanishing_threshold)
    for name in ("grad_scale", "grad_temperature"):
        value = getattr(result, name)
        if value is not None and not math.isfinite(value):
            raise not_finite_error(f"{name} is not finite", dtype)
    return result
