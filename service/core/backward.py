"""Backward pass through attention, and the health of the gradients (semantics.md, "Gradients").

With ``Z = (scale * Q K^T + bias) / T`` the normalizer input (``-inf`` where
masked), ``A = normalizer(Z)`` and ``O = A V``, for an upstream gradient ``dO``
(and optionally ``dA_extra`` on the weights):

* ``dV = A^T dO``; ``dA = dO V^T + dA_extra``; ``dZ = backward(dA)`` (the
  normalizer's vector-Jacobian product, :func:`service.core.normalizers.normalize_backward`);
* ``dQ = (scale/T) dZ K``; ``dK = (scale/T) dZ^T Q``; the query heads sharing a
  key/value head (grouped-query attention) add their contributions to it;
* ``grad_mask = dZ / T`` summed over the axes the float mask broadcasts along;
* ``grad_scale = sum(dZ * Q K^T) / T``, computed as ``sum(Q * dQ) / scale``
  (the same number: ``sum(Q * dQ) = (scale/T) sum(dZ * Q K^T)``), so it costs no
  extra product;
* ``grad_temperature = -sum(dZ * Z) / T`` over unmasked positions.

ReLU is the exception to the order above: ``relu(Z) / sum(relu(Z))`` does not
change when ``Z`` is multiplied by a positive number, so its weights are those
of ``T = 1`` whatever the temperature (the forward pass already leaves the
temperature out for it). Its backward pass therefore runs at ``T = 1`` too, and
a temperature that would overflow the scores (``1e-40`` in float32) is no
error there either; its ``grad_temperature`` is exactly 0 (Euler's theorem for
a function homogeneous of degree 0: ``sum_j Z_j dA_i/dZ_j = 0``), and its
Jacobian norms are those at ``T = 1`` times ``T`` (``J(Z / T) = T J(Z)``).
Like the forward pass it forms the scores, the weights and ``dZ`` in float64
and rounds only the results, so float32 scores that would underflow, overflow
or turn subnormal still give the float64 gradients to float32 precision.

Masked positions get exactly zero gradient (every normalizer's Jacobian is zero
off its support, and masked weights are exactly 0); fully masked rows give zero
gradients, never NaN.

Gradient health of a row is the Frobenius norm of the normalizer's Jacobian
``J = dA/dZ`` (:func:`jacobian_norms`). The work is done on the same chunks of
query rows as the forward pass (:func:`service.core.attention.run_attention`),
so the extra memory is a few chunk-sized temporaries per thread.
"""

from __future__ import annotations

import math
import threading
from concurrent.futures import Executor
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from service.core import normalizers
from service.core.attention import (
    _Chunk,
    _chunk_keep,
    _chunk_rows,
    _chunk_scores,
    _chunk_valid,
    _mask5,
    _mask_chunk,
    _prepare,
    _relu_scores,
    _split_heads,
    check_live_rows,
    check_scores_finite,
    promote_to_4d,
    run_chunks,
)
from service.core.errors import InvalidInput, NumericalError
from service.core.masks import as_4d_mask
from service.core.types import AttentionTask

GRADIENTS: tuple[str, ...] = ("grad_query", "grad_key", "grad_value", "grad_mask", "grad_scale", "grad_temperature")
BACKWARD_RETURNS: tuple[str, ...] = GRADIENTS + ("output", "weights", "gradient_health")
DEFAULT_RETURNS: frozenset[str] = frozenset({"grad_query", "grad_key", "grad_value"})
DEFAULT_VANISHING_THRESHOLD = 1e-3

__all__ = [
    "BACKWARD_RETURNS",
    "DEFAULT_VANISHING_THRESHOLD",
    "GRADIENTS",
    "BackwardResult",
    "BackwardTask",
    "checked_gradient",
    "GradientHealth",
    "gradient_health",
    "jacobian_norms",
    "run_backward",
    "sum_to_shape",
]


@dataclass(slots=True)
class BackwardTask:
    """One backward request: the forward task, the upstream gradients and what to return.

    ``grad_output`` has the output's shape (``query.shape[:-1] + (Ev,)``);
    ``grad_weights``, when given, the weights' shape (``query.shape[:-1] + (S,)``)
    and is added to the gradient that flows into the weights. ``want`` is a
    subset of :data:`BACKWARD_RETURNS`.
    """

    task: AttentionTask
    grad_output: np.ndarray
    grad_weights: np.ndarray | None = None
    want: frozenset[str] = DEFAULT_RETURNS
    vanishing_threshold: float = DEFAULT_VANISHING_THRESHOLD


@dataclass(slots=True)
class GradientHealth:
    """Per (batch, query head): mean Jacobian norm and vanishing fraction over the informative rows.

    Informative rows have at least two valid keys (with one, or none, every
    normalizer's Jacobian is 0 whatever the scores: nothing to learn there).
    ``rows`` counts them; a head without any has mean 0 and fraction 0.
    """

    mean_jacobian_norm: np.ndarray  # (B, Hq)
    vanishing_fraction: np.ndarray  # (B, Hq)
    rows: np.ndarray  # (B, Hq) informative rows
    threshold: float

    def heads(self) -> list[dict[str, Any]]:
        """JSON-ready list in (batch, head) order."""
        B, H = self.rows.shape
        return [
            {
                "batch": b,
                "head": h,
                "mean_jacobian_norm": float(self.mean_jacobian_norm[b, h]),
                "vanishing_fraction": float(self.vanishing_fraction[b, h]),
                "rows": int(self.rows[b, h]),
            }
            for b in range(B)
            for h in range(H)
        ]


@dataclass(slots=True)
class BackwardResult:
    """What a backward call returns; fields not asked for are None. Tensors have their inputs' shapes."""

    grad_query: np.ndarray | None = None
    grad_key: np.ndarray | None = None
    grad_value: np.ndarray | None = None
    grad_mask: np.ndarray | None = None
    grad_scale: float | None = None
    grad_temperature: float | None = None
    output: np.ndarray | None = None
    weights: np.ndarray | None = None
    gradient_health: GradientHealth | None = None
    valid_keys: np.ndarray = field(default_factory=lambda: np.zeros((0, 0, 0), dtype=np.int64))


# --------------------------------------------------------------------------- Jacobian norms


def _normalizer_alpha(normalizer: str, alpha: float | None) -> float | None:
    """The entmax alpha of a normalizer (softmax 1, entmax15 1.5, sparsemax 2); None for relu."""
    if normalizer == "softmax":
        return 1.0
    if normalizer == "entmax15":
        return 1.5
    if normalizer == "sparsemax":
        return 2.0
    if normalizer == "entmax":
        if alpha is None or not math.isfinite(alpha) or alpha <= 1:
            raise InvalidInput("normalizer 'entmax' needs a finite alpha > 1", ("alpha",))
        return float(alpha)
    if normalizer == "relu":
        return None
    raise InvalidInput(f"unknown normalizer {normalizer!r}", ("normalizer",))


def jacobian_norms(
    normalizer: str, p: np.ndarray, *, z: np.ndarray | None = None, alpha: float | None = None
) -> np.ndarray:
    """Frobenius norm of ``J = dA/dZ`` for every row of ``p`` (last axis), in float64.

    softmax and alpha-entmax (sparsemax alpha 2, entmax15 alpha 1.5): on the
    support ``J = diag(w) - w w^T / sum(w)`` with ``w = p^(2 - alpha)`` (Peters
    et al. 2019; softmax: ``w = p``, ``sum(w) = 1``, ``J = diag(p) - p p^T``), so
    ``||J||_F^2 = sum w^2 - 2 sum w^3 / s + (sum w^2 / s)^2`` with ``s = sum w``;
    for softmax that is semantics.md's ``sum p^2 - 2 sum p^3 + (sum p^2)^2``, and
    for sparsemax ``|S| - 1``. relu (``p = r / s``, ``r = relu(z)``): ``J =
    (diag(a) - p a^T) / s`` with ``a`` the indicator of ``z > 0``, so
    ``||J||_F^2 = (k - 2 + k sum p^2) / s^2`` with ``k = sum a``; relu needs ``z``.
    Rows without support (fully masked, or relu rows with no positive score) give 0.
    The closed forms cancel for nearly one-hot rows: absolute error ~1e-8, far
    below any useful vanishing threshold.
    """
    p64 = np.asarray(p, dtype=np.float64)
    a = _normalizer_alpha(normalizer, alpha)
    with np.errstate(under="ignore"):
        if a is None:
            if z is None:
                raise ValueError("jacobian_norms('relu', ...) needs the scores z")
            z64 = np.asarray(z, dtype=np.float64)
            active = z64 > 0
            k = np.count_nonzero(active, axis=-1).astype(np.float64)
            s = normalizers.relu_row_sums(z64, p64)[..., 0]  # not summed: no overflow near 1e308
            sq = np.square(p64).sum(axis=-1)
            # the norm divided by s, not its square by s^2 (which underflows to 0 for s below 1e-154)
            relu_norms: np.ndarray = np.where(k > 0, np.sqrt(np.maximum(k - 2.0 + k * sq, 0.0)) / s, 0.0)
            return relu_norms
        support = p64 > 0
        if a == 1.0:
            w = p64
        elif a == 2.0:
            w = support.astype(np.float64)
        else:
            w = np.zeros_like(p64)
            np.power(p64, 2.0 - a, out=w, where=support)
        s = w.sum(axis=-1)
        w2 = np.square(w)
        s2 = w2.sum(axis=-1)
        s3 = (w2 * w).sum(axis=-1)
        live = s > 0
        safe = np.where(live, s, 1.0)
        n2 = np.where(live, s2 - 2.0 * s3 / safe + np.square(s2 / safe), 0.0)
    return np.sqrt(np.maximum(n2, 0.0))


def gradient_health(norms: np.ndarray, valid_keys: np.ndarray, threshold: float) -> GradientHealth:
    """Per-head summary of per-row Jacobian norms ``(B, Hq, L)`` over rows with at least two valid keys."""
    informative = valid_keys >= 2
    rows = informative.sum(axis=-1)
    safe = np.maximum(rows, 1)
    mean = np.where(informative, norms, 0.0).sum(axis=-1) / safe
    vanishing = (informative & (norms < threshold)).sum(axis=-1) / safe
    return GradientHealth(
        mean_jacobian_norm=mean, vanishing_fraction=vanishing.astype(np.float64), rows=rows, threshold=threshold
    )


# --------------------------------------------------------------------------- helpers


def sum_to_shape(x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Sum ``x`` over the axes where ``shape`` (same rank) has size 1 and ``x`` does not (keepdims)."""
    axes = tuple(i for i, (have, want) in enumerate(zip(x.shape, shape, strict=True)) if want == 1 and have != 1)
    return x.sum(axis=axes, keepdims=True) if axes else x


def checked_gradient(arr: np.ndarray, expected: tuple[int, ...], name: str, what: str, dtype: np.dtype) -> np.ndarray:
    """An upstream gradient of the ``what``'s shape ``expected``, as a contiguous rank-4 array of ``dtype``, finite."""
    a = np.asarray(arr)
    if a.shape != expected:
        raise InvalidInput(f"{name} has shape {a.shape}, expected the {what}'s shape {expected}", (name,))
    if not np.issubdtype(a.dtype, np.floating) and not np.issubdtype(a.dtype, np.integer):
        raise InvalidInput(f"{name} must hold numbers", (name,))
    with np.errstate(over="ignore"):
        out = np.ascontiguousarray(promote_to_4d(a), dtype=dtype)
    if not np.isfinite(out).all():
        raise InvalidInput(f"{name} must be finite (in {dtype.name})", (name,))
    return out


# --------------------------------------------------------------------------- the backward pass


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
    """The backward pass of :func:`service.core.attention.run_attention` on numpy (module docstring).

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
    # relu's weights do not depend on the temperature: compute at T = 1 (module docstring)
    temperature_free = params.normalizer == "relu"
    p = _prepare(task.inputs, replace(params, temperature=1.0) if temperature_free else params, task.dtype)
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
    gm5 = _mask5(gm4, d)

    need_dq = bool({"grad_query", "grad_scale"} & want)
    need_dz = need_dq or bool({"grad_key", "grad_mask", "grad_temperature"} & want)
    dq = np.zeros_like(p.q) if need_dq else None
    dk = np.zeros_like(p.k) if "grad_key" in want else None
    dv = np.zeros_like(p.v) if "grad_value" in want else None
    output = np.empty((d.B, d.Hq, d.L, d.Ev), dtype=dtype) if "output" in want else None
    weights = np.empty(d.weights_shape, dtype=dtype) if "weights" in want else None
    norms = np.zeros((d.B, d.Hq, d.L), dtype=np.float64) if "gradient_health" in want else None
    dq5 = None if dq is None else _split_heads(dq, d)
    out5 = None if output is None else _split_heads(output, d)
    w5 = None if weights is None else _split_heads(weights, d)
    go5 = _split_heads(go4, d)
    gw5 = None if gw4 is None else _split_heads(gw4, d)
    norms5 = None if norms is None else norms.reshape(d.B, d.Hkv, d.group, d.L)
    # scale / T as the scores used it: float64 where it underflows the dtype (attention.score_factor), so dQ
    # and dK are formed in float64 and rounded once; relu's, with its float64 dZ, is scale (T = 1) itself
    factor = np.float64(p.scale) if temperature_free else p.factor
    normalizer, alpha = params.normalizer, params.alpha
    lock = threading.Lock()
    temperature_sum = [0.0]
    scale_sum = [0.0]  # relu's grad_scale (the others take it from the rounded dQ below)

    def work(c: _Chunk) -> None:
        nkv = c.kv.stop - c.kv.start
        ng, nl = c.g.stop - c.g.start, c.l.stop - c.l.start
        with np.errstate(over="ignore", invalid="ignore", under="ignore"):
            v = p.v[c.b, c.kv]
            d_o = _chunk_rows(go5, c)
            if temperature_free:
                # relu as in the forward pass: float64 scores (attention._relu_scores) and weights; its VJP and
                # Jacobian use those, the products with V and dO the weights rounded as the forward returns them
                z = _relu_scores(
                    p, p.q5[c.b, c.kv, c.g, c.l], p.k[c.b, c.kv], _mask_chunk(p.raw_bias5, c), _mask_chunk(p.drop5, c)
                )
                a_exact = normalizers.relu_normalize(z)
                a = a_exact.astype(dtype, copy=False)
            else:
                z = np.empty((nkv, ng * nl, d.S), dtype=dtype)
                _chunk_scores(p, c, z)
                # overflow is a NumericalError, as in the forward pass: never a silent dead row
                check_scores_finite(z.reshape(nkv, ng, nl, d.S), _chunk_keep(p, c), dtype)
                check_live_rows(np.isneginf(z.max(axis=-1)), _chunk_valid(p, c), dtype)
                # softmax runs in place when nothing needs the scores afterwards (the temperature's gradient does)
                in_place = normalizer == "softmax" and "grad_temperature" not in want
                a = a_exact = normalizers.normalize(z, normalizer, alpha=alpha, out=z if in_place else None)
            if out5 is not None:
                np.matmul(a, v, out=_chunk_rows(out5, c))
            if w5 is not None:
                _chunk_rows(w5, c)[...] = a
            if norms5 is not None:
                chunk_norms = jacobian_norms(normalizer, a_exact, z=z, alpha=alpha).reshape(nkv, ng, nl)
                norms5[c.b, c.kv, c.g, c.l] = chunk_norms * params.temperature if temperature_free else chunk_norms
            dv_part = np.matmul(a.transpose(0, 2, 1), d_o) if dv is not None else None
            dk_part = gm_part = None
            t_part = s_part = 0.0
            if need_dz:
                da = np.matmul(d_o, v.transpose(0, 2, 1))
                if gw5 is not None:
                    da += _chunk_rows(gw5, c)
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
                    np.multiply(np.matmul(dz, p.k[c.b, c.kv]), factor, out=_chunk_rows(dq5, c))
                if temperature_free and "grad_scale" in want:
                    s_part = _relu_scale_gradient(dz.reshape(nkv, ng, nl, d.S), _mask_chunk(p.raw_bias5, c), p.scale)
                if dk is not None:
                    dk_part = np.matmul(dz.transpose(0, 2, 1), _chunk_rows(p.q5, c))
                    dk_part *= factor
                if "grad_temperature" in want and not temperature_free:
                    t_part = float(np.sum(dz * np.where(np.isneginf(z), 0, z), dtype=np.float64))
                if gm5 is not None:
                    target = _mask_chunk(gm5, c)
                    assert target is not None
                    gm_part = sum_to_shape(dz.reshape(nkv, ng, nl, d.S).astype(np.float64), target.shape)
        with lock:
            if dv is not None and dv_part is not None:
                dv[c.b, c.kv] += dv_part
            if dk is not None and dk_part is not None:
                dk[c.b, c.kv] += dk_part
            if gm_part is not None:
                target = _mask_chunk(gm5, c)
                assert target is not None
                target += gm_part
            temperature_sum[0] += t_part
            scale_sum[0] += s_part

    run_chunks(d, work, executor, workers)

    T = 1.0 if temperature_free else params.temperature  # the temperature the gradients were computed at
    scale = p.scale  # the request's, or 1/sqrt(E) (_prepare)
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
            raise NumericalError(
                f"{name} is not finite in {dtype.name}: the scores or gradients overflowed; "
                "retry with precision float64 or smaller inputs"
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
            raise NumericalError(f"{name} is not finite; retry with precision float64 or smaller inputs")
    return result
