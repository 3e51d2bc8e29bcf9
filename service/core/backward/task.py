"""What a backward request asks for and gets back, and the checks of its upstream gradients."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from service.core.attention import promote_to_4d
from service.core.backward.health import DEFAULT_VANISHING_THRESHOLD, GradientHealth
from service.core.errors import InvalidInput
from service.core.types import AttentionTask

GRADIENTS: tuple[str, ...] = ("grad_query", "grad_key", "grad_value", "grad_mask", "grad_scale", "grad_temperature")
BACKWARD_RETURNS: tuple[str, ...] = GRADIENTS + ("output", "weights", "gradient_health")
DEFAULT_RETURNS: frozenset[str] = frozenset({"grad_query", "grad_key", "grad_value"})


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
