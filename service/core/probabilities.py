"""Normalizing a logits tensor along one axis (the maths behind /v1/softmax)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from service.core import normalizers
from service.core.errors import InvalidInput, wider_remedies


@dataclass(slots=True)
class Probabilities:
    """Result of :func:`normalize_logits`; ``log_probabilities`` only when asked (softmax only)."""

    probabilities: np.ndarray
    log_probabilities: np.ndarray | None


def normalize_logits(
    logits: np.ndarray,
    *,
    normalizer: str = "softmax",
    alpha: float | None = None,
    temperature: float = 1.0,
    mask: np.ndarray | None = None,
    axis: int = -1,
    with_log: bool = False,
    dtype: np.dtype | type = np.float32,
) -> Probabilities:
    """Normalize ``(logits + float mask) / temperature`` along ``axis``.

    A boolean ``mask`` (True = keep) removes positions by selection; a float
    mask is added before the temperature divides, as in attention. Masked
    positions get probability 0 (log-probability -inf); a fully masked slice
    gives all zeros.
    """
    dtype = np.dtype(dtype)
    if normalizer not in normalizers.NORMALIZER_NAMES:
        raise InvalidInput(f"normalizer must be one of {', '.join(normalizers.NORMALIZER_NAMES)}", ("normalizer",))
    if normalizer == "entmax" and (alpha is None or alpha <= 1):
        raise InvalidInput("normalizer 'entmax' needs alpha > 1 (alpha = 1 is softmax)", ("alpha",))
    if with_log and normalizer != "softmax":
        raise InvalidInput("log=true is only defined for the softmax normalizer", ("log",))
    if not -logits.ndim <= axis < logits.ndim:
        raise InvalidInput(f"axis {axis} is out of range for logits of rank {logits.ndim}", ("axis",))
    # (logits + mask) / T is formed in float64 and rounded once to the dtype: no intermediate overflow
    # (3e38 + 3e38 in float32), no -inf / inf = NaN for a temperature beyond float32's range.
    z64 = np.array(logits, dtype=np.float64, copy=True)
    masked: np.ndarray | None = None
    if mask is not None:
        try:
            if np.broadcast_shapes(mask.shape, z64.shape) != z64.shape:
                raise ValueError
        except ValueError:
            raise InvalidInput(
                f"mask shape {tuple(mask.shape)} does not broadcast to the logits shape {tuple(z64.shape)}",
                ("mask", "shape"),
            ) from None
        if mask.dtype == bool:
            masked = np.broadcast_to(~mask, z64.shape)
        else:
            if np.isnan(mask).any() or np.isposinf(mask).any():
                raise InvalidInput("a float mask may hold finite numbers or -inf, not NaN or +inf", ("mask",))
            with np.errstate(over="ignore"):
                z64 += mask
            masked = np.broadcast_to(np.isneginf(mask), z64.shape)
        np.copyto(z64, -np.inf, where=masked)
    # relu is invariant to a positive temperature (relu(z/T) = relu(z)/T): leaving T out keeps
    # [1e-40, 2e-40, 0] at T = 1e6 from underflowing into a row of zeros.
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        if normalizer != "relu":
            z64 /= temperature
        z = z64.astype(dtype)
    kept = np.ones(z.shape, dtype=bool) if masked is None else ~masked
    if not np.isfinite(z[kept]).all():
        what = "logits + mask" if normalizer == "relu" else "(logits + mask) / temperature"
        hint = "smaller logits" if normalizer == "relu" else "a larger temperature"
        wider = "precision float64 or " if dtype != np.float64 else ""
        remedies = wider_remedies(dtype.name, "smaller_inputs" if normalizer == "relu" else "larger_temperature")
        raise InvalidInput(f"{what} overflows {dtype.name}; use {wider}{hint}", ("logits",), remedies=remedies)
    if normalizer == "relu":  # from the float64 values: subnormal float32 logits keep their ratios
        p = normalizers.relu_normalize(z64, axis=axis).astype(dtype)
    else:
        p = normalizers.normalize(z, normalizer, alpha=alpha, axis=axis)
    logp = _log_probabilities(z, kept, axis, dtype) if with_log else None
    return Probabilities(probabilities=p, log_probabilities=logp)


def _log_probabilities(z: np.ndarray, kept: np.ndarray, axis: int, dtype: np.dtype) -> np.ndarray:
    """log_softmax of ``z``, computed in float64 and rounded once to ``dtype``.

    ``-inf`` means "masked" on the wire (JSON ``null``), so an unmasked log-probability
    that does not fit ``dtype`` (float32 logits [3e38, -3e38] give -6e38) is refused as invalid input,
    never a silent ``-inf``.
    """
    logp64 = normalizers.log_softmax(z.astype(np.float64), axis=axis)
    with np.errstate(over="ignore"):
        logp = logp64.astype(dtype)
    bad = kept & ~np.isfinite(logp) & np.any(kept, axis=axis, keepdims=True)
    if bad.any():
        idx = tuple(int(i) for i in np.unravel_index(int(np.flatnonzero(bad)[0]), bad.shape))
        exact = float(logp64[idx])
        value = f"{exact:.3g}" if np.isfinite(exact) else f"below {-float(np.finfo(np.float64).max):.3g}"
        remedies: tuple[str, ...] = ("float64", "omit_log")
        advice = "use precision float64 (or leave out log)"
        if dtype == np.float64:  # already in force: the probabilities are representable, their logs are not
            remedies = ("omit_log", "smaller_inputs", "larger_temperature")
            advice = "leave out log (the probabilities are representable), or use smaller logits or a larger "
            advice += "temperature"
        raise InvalidInput(
            f"the log-probability of logits{list(idx)} is {value}, beyond {dtype.name}'s range; " + advice,
            ("logits", *idx),
            remedies=remedies,
        )
    return logp
