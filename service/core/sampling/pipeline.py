"""The whole pipeline (steps 1-8) on a logits array: :func:`process`, and the raw softmax's statistics."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from service.core.errors import InvalidInput, wider_remedies
from service.core.sampling.filters import Filtered, filter_logits, greedy, logsumexp
from service.core.sampling.params import SamplingParams, TokenLists, check_params
from service.core.sampling.penalties import apply_mask, apply_penalties, previous_token_pairs


@dataclass(slots=True)
class RawStats:
    """Log-sum-exp and entropy of ``softmax(logits)`` as given, per row."""

    max: np.ndarray
    lse: np.ndarray
    entropy: np.ndarray


def raw_stats(logits: np.ndarray) -> RawStats:
    """Per-row max, log-sum-exp (of ``logits - max``) and softmax entropy (nats) of finite (N, V) logits."""
    m = np.max(logits, axis=-1, keepdims=True)
    with np.errstate(over="ignore"):
        x = logits - m  # may overflow to -inf across the whole float range ...
    np.maximum(x, np.finfo(x.dtype).min, out=x)  # ... and 0 * -inf would be NaN in the entropy
    with np.errstate(under="ignore"):
        e = np.exp(x)
    s = np.sum(e, axis=-1, dtype=np.float64)
    ex = np.einsum("ij,ij->i", e, x, dtype=np.float64)  # sum of e * x without a temporary
    lse = np.log(s)
    return RawStats(m[:, 0].astype(np.float64), lse, np.maximum(lse - ex / s, 0.0))


@dataclass(slots=True)
class SampleResult:
    """Everything /v1/sample can return; fields not asked for are None."""

    filtered: Filtered
    tokens: np.ndarray | None
    logprobs: np.ndarray | None
    raw_logprobs: np.ndarray | None
    entropy_raw: np.ndarray | None


def process(
    logits: np.ndarray,
    params: SamplingParams,
    *,
    mask: np.ndarray | None = None,
    previous_tokens: TokenLists | None = None,
    dtype: np.dtype | type | None = None,
    removed_mass: bool = True,
    raw: RawStats | None = None,
) -> tuple[Filtered, np.ndarray]:
    """Steps 1-8 on finite logits (V,) or (N, V): the final distribution and step 3's values (N, V).

    ``removed_mass=False`` skips the pass that diagnostic needs; ``raw`` (:func:`raw_stats` of the same
    logits) saves it when steps 1-4 leave the logits as they are. Raises :class:`InvalidInput` for bad
    options, a mask that does not broadcast, token ids out of range, and rows with no token left after
    the mask (nothing to sample).
    """
    check_params(params)
    if logits.ndim not in (1, 2):
        raise InvalidInput(f"logits must have rank 1 (V,) or 2 (N, V), got rank {logits.ndim}", ("logits",))
    dtype = np.dtype(dtype or (logits.dtype if logits.dtype.kind == "f" else np.float64))
    z = np.array(np.atleast_2d(logits), dtype=dtype, copy=True)
    n_rows, vocab = z.shape
    if mask is not None:
        if mask.ndim > 2:
            raise InvalidInput(f"mask has rank {mask.ndim}; the logits have rank {logits.ndim}", ("mask", "shape"))
        apply_mask(z, mask)
    penalized = False
    alive: np.ndarray | None = None  # rows with a token left after the mask, before the penalties
    if previous_tokens is not None:
        r, t = previous_token_pairs(previous_tokens, n_rows, vocab)
        alive = np.max(z, axis=-1) > -np.inf
        penalized = apply_penalties(z, r, t, params)
    zmax = np.max(z, axis=-1, keepdims=True)
    dead = np.nonzero(zmax[:, 0] == -np.inf)[0]
    if dead.size:
        row = int(dead[0])
        if penalized and alive is not None and alive[row]:
            raise penalties_error(params, row, dtype)
        loc: tuple[str | int, ...] = ("mask",) if logits.ndim == 1 else ("mask", row)
        raise InvalidInput(f"the mask removes every token of row {row}: there is nothing to sample", loc)
    if params.temperature == 0:
        return greedy(z), z
    if params.temperature == 1:
        with np.errstate(over="ignore"):  # z - max overflowing to -inf: weight 0, as exp of it
            y = z - zmax
    else:
        y = scaled_shifted(z, params.temperature, dtype)
    unchanged = mask is None and not penalized and params.temperature == 1
    if raw is not None and unchanged:  # y is the logits minus their max: the raw log-sum-exp is y's
        lse_all: np.ndarray | None = raw.lse
    else:
        lse_all = logsumexp(y) if removed_mass else None
    return filter_logits(y, params, lse_all=lse_all), z


def scaled_shifted(z: np.ndarray, temperature: float, dtype: np.dtype) -> np.ndarray:
    """Step 4's values shifted to a row max of 0, ``(z - max z) / T``, formed in float64 and rounded once to ``dtype``.

    /v1/softmax's rule (:func:`service.core.probabilities.normalize_logits` forms ``(logits + mask) / T`` in
    float64 and rounds once): no temperature is capped or rounded to the dtype first, so logits that span more
    than the dtype come back when T brings them back (float32 ``[-1e38, 3e38, 0]`` at ``T = 1e38`` is
    softmax of ``[-1, 3, 0]``). With ``T >= 1`` the logits are divided first (``|z / T| <= |z|``: nothing
    overflows, where ``z - max`` may); with ``T < 1`` the differences from the max are divided (``z / T`` may
    overflow, the differences only towards ``-inf``). Either way a value that overflows to ``-inf`` is below
    the max by more than the float range: its weight is 0 to any precision.
    """
    z64 = z.astype(np.float64)
    with np.errstate(over="ignore", under="ignore"):
        if temperature >= 1:
            z64 /= temperature
            z64 -= np.max(z64, axis=-1, keepdims=True)
        else:
            z64 -= np.max(z64, axis=-1, keepdims=True)
            z64 /= temperature
        return z64.astype(dtype)


def penalties_error(params: SamplingParams, row: int, dtype: np.dtype) -> InvalidInput:
    """Every token of ``row`` that the mask kept was pushed beyond the dtype's range by the penalties.

    The error names the penalties (the first one in force is the location) and ``previous_tokens``, never the
    mask, which may not even have been sent.
    """
    active = [
        (name, value)
        for name, value, neutral in (
            ("repetition_penalty", params.repetition_penalty, 1.0),
            ("frequency_penalty", params.frequency_penalty, 0.0),
            ("presence_penalty", params.presence_penalty, 0.0),
        )
        if value != neutral
    ]
    named = ", ".join(f"{name} = {value:.3g}" for name, value in active)
    wider = "precision float64 or " if dtype != np.float64 else ""
    return InvalidInput(
        f"the penalties ({named}) on the previous_tokens push every token of row {row} below {dtype.name}'s "
        f"range: there is nothing to sample; use {wider}smaller penalties",
        (active[0][0],),
        remedies=wider_remedies(dtype.name, "smaller_penalties"),
    )
