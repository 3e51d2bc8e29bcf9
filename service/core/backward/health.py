"""Gradient health: the Frobenius norm of each row's normalizer Jacobian ``J = dA/dZ``, and its per-head summary."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from service.core import normalizers
from service.core.errors import InvalidInput

DEFAULT_VANISHING_THRESHOLD = 1e-3


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
    for softmax that is the contract's ``sum p^2 - 2 sum p^3 + (sum p^2)^2``, and
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
