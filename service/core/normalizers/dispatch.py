"""The normalizers by name: :func:`normalize` and :func:`normalize_backward`."""

from __future__ import annotations

import numpy as np

from service.core.normalizers.bisection import entmax_bisect
from service.core.normalizers.gradients import entmax_backward, relu_backward, softmax_backward, sparsemax_backward
from service.core.normalizers.relu import relu_normalize
from service.core.normalizers.softmax import softmax
from service.core.normalizers.sparse import entmax15, sparsemax

NORMALIZER_NAMES: tuple[str, ...] = ("softmax", "sparsemax", "entmax15", "entmax", "relu")


def _check_name(normalizer: str) -> None:
    if normalizer not in NORMALIZER_NAMES:
        raise ValueError(f"unknown normalizer {normalizer!r}; expected one of {', '.join(NORMALIZER_NAMES)}")


def _entmax_alpha(alpha: float | None) -> float:
    if alpha is None:
        raise ValueError("normalizer 'entmax' needs alpha > 1")
    a = float(alpha)
    if not (np.isfinite(a) and a > 1.0):
        raise ValueError(f"normalizer 'entmax' needs alpha > 1, got {alpha} (use softmax)")
    return a


def normalize(
    z: np.ndarray,
    normalizer: str,
    *,
    alpha: float | None = None,
    axis: int = -1,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Apply the named normalizer along ``axis``.

    ``"entmax"`` needs ``alpha > 1`` (ValueError otherwise); ``alpha == 1.5``
    routes to the exact sort-based :func:`entmax15` and ``alpha == 2.0`` to
    :func:`sparsemax`, any other alpha to :func:`entmax_bisect`. ``alpha`` is
    ignored by the other normalizers. ``out`` (same shape, floating) receives the
    result and is returned; it may be ``z`` itself. For ``"softmax"`` the work is
    done in ``out`` with no full-size temporaries; the others compute and copy.
    """
    _check_name(normalizer)
    if normalizer == "softmax":
        return softmax(z, axis, out=out)
    if normalizer == "sparsemax":
        res = sparsemax(z, axis)
    elif normalizer == "entmax15":
        res = entmax15(z, axis)
    elif normalizer == "relu":
        res = relu_normalize(z, axis)
    else:
        a = _entmax_alpha(alpha)
        if a == 2.0:
            res = sparsemax(z, axis)
        elif a == 1.5:
            res = entmax15(z, axis)
        else:
            res = entmax_bisect(z, a, axis)
    if out is None:
        return res
    if out.shape != res.shape:
        raise ValueError(f"out has shape {out.shape}, expected {res.shape}")
    np.copyto(out, res, casting="same_kind")
    return out


def normalize_backward(
    normalizer: str,
    p: np.ndarray,
    g: np.ndarray,
    *,
    alpha: float | None = None,
    z: np.ndarray | None = None,
    axis: int = -1,
) -> np.ndarray:
    """Vector-Jacobian product: given ``g = dL/dp`` on the output ``p``, return ``dL/dz``.

    ``"entmax"`` needs ``alpha > 1``; ``"relu"`` needs the scores ``z`` too (its
    Jacobian is not a function of ``p`` alone), and ``p`` must be their relu weights.
    """
    _check_name(normalizer)
    if normalizer == "softmax":
        return softmax_backward(p, g, axis)
    if normalizer == "sparsemax":
        return sparsemax_backward(p, g, axis)
    if normalizer == "entmax15":
        return entmax_backward(p, g, 1.5, axis)
    if normalizer == "entmax":
        return entmax_backward(p, g, _entmax_alpha(alpha), axis)
    if z is None:
        raise ValueError("normalize_backward('relu', ...) needs the scores z")
    return relu_backward(z, g, axis, p=p)
