"""Normalizing a logits tensor along one axis (the maths behind /v1/softmax)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from service.core import normalizers
from service.core.errors import InvalidInput


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
    z = np.array(logits, dtype=dtype, copy=True)
    if mask is not None:
        try:
            np.broadcast_shapes(mask.shape, z.shape)
            if np.broadcast_shapes(mask.shape, z.shape) != z.shape:
                raise ValueError
        except ValueError:
            raise InvalidInput(
                f"mask shape {tuple(mask.shape)} does not broadcast to the logits shape {tuple(z.shape)}",
                ("mask", "shape"),
            ) from None
        if mask.dtype == bool:
            np.copyto(z, -np.inf, where=~mask)
        else:
            if np.isnan(mask).any() or np.isposinf(mask).any():
                raise InvalidInput("a float mask may hold finite numbers or -inf, not NaN or +inf", ("mask",))
            z += mask.astype(dtype, copy=False)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        z /= temperature  # a tiny temperature may overflow: reported just below, never as NaN
    if not np.isfinite(z[~np.isneginf(z)]).all():
        raise InvalidInput(
            f"logits / temperature overflow {dtype.name}; use precision float64 or a larger temperature", ("logits",)
        )
    p = normalizers.normalize(z, normalizer, alpha=alpha, axis=axis)
    logp = normalizers.log_softmax(z, axis=axis) if with_log else None
    return Probabilities(probabilities=p, log_probabilities=logp)
