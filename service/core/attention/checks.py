"""What an attention call may ask for: its shapes (docs/concepts/contract.md, "Shapes") and its options."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from service.core import normalizers
from service.core.errors import InvalidInput
from service.core.types import AttentionParams

COMPUTE_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def promote_to_4d(x: np.ndarray) -> np.ndarray:
    """View a rank 2-4 tensor as rank 4 by prepending axes of size 1."""
    if x.ndim == 4:
        return x
    if not 2 <= x.ndim <= 4:
        raise InvalidInput(f"expected rank 2 to 4, got rank {x.ndim}")
    return x.reshape((1,) * (4 - x.ndim) + x.shape)


@dataclass(frozen=True, slots=True)
class Dims:
    """Sizes of one attention call after promotion to rank 4."""

    B: int
    Hq: int
    Hkv: int
    L: int
    S: int
    E: int
    Ev: int

    @property
    def group(self) -> int:
        """Query heads per key/value head."""
        return self.Hq // self.Hkv

    @property
    def weights_shape(self) -> tuple[int, int, int, int]:
        return (self.B, self.Hq, self.L, self.S)


def check_dims(query_shape: tuple[int, ...], key_shape: tuple[int, ...], value_shape: tuple[int, ...]) -> Dims:
    """Check the shapes agree (docs/concepts/contract.md, "Shapes") and return the sizes.

    Errors name the field and dimension, e.g. "key has E=32 but query has E=64". Cached per shapes (a request
    checks its shapes in the API, the cost estimates and the engine; errors are not cached).
    """
    return _check_dims(tuple(query_shape), tuple(key_shape), tuple(value_shape))


@lru_cache(maxsize=256)
def _check_dims(query_shape: tuple[int, ...], key_shape: tuple[int, ...], value_shape: tuple[int, ...]) -> Dims:
    for name, shape in (("query", query_shape), ("key", key_shape), ("value", value_shape)):
        if not 2 <= len(shape) <= 4:
            raise InvalidInput(f"{name} must have rank 2 to 4, got rank {len(shape)} (shape {tuple(shape)})", (name,))
        for ax, size in enumerate(shape):
            if size < 1:
                raise InvalidInput(
                    f"{name} has a dimension of size {size} at axis {ax}; sizes must be >= 1", (name, "shape", ax)
                )
    if not (len(query_shape) == len(key_shape) == len(value_shape)):
        raise InvalidInput(
            "query, key and value must have the same rank; "
            f"got {len(query_shape)}, {len(key_shape)} and {len(value_shape)}",
            ("key",),
        )
    rank = len(query_shape)
    q = (1,) * (4 - rank) + tuple(query_shape)
    k = (1,) * (4 - rank) + tuple(key_shape)
    v = (1,) * (4 - rank) + tuple(value_shape)
    off = 4 - rank

    def axis(i: int) -> int:
        return i - off

    if k[3] != q[3]:
        raise InvalidInput(f"key has E={k[3]} but query has E={q[3]}", ("key", "shape", axis(3)))
    if k[0] != q[0]:
        raise InvalidInput(f"key has B={k[0]} but query has B={q[0]}", ("key", "shape", axis(0)))
    if v[0] != k[0]:
        raise InvalidInput(f"value has B={v[0]} but key has B={k[0]}", ("value", "shape", axis(0)))
    if v[1] != k[1]:
        raise InvalidInput(f"value has H={v[1]} but key has H={k[1]}", ("value", "shape", axis(1)))
    if v[2] != k[2]:
        raise InvalidInput(f"value has S={v[2]} but key has S={k[2]}", ("value", "shape", axis(2)))
    if q[1] % k[1] != 0:
        raise InvalidInput(
            f"query has H={q[1]} heads, not a multiple of key's H={k[1]} (grouped-query attention needs Hq % Hkv == 0)",
            ("key", "shape", axis(1)),
        )
    return Dims(B=q[0], Hq=q[1], Hkv=k[1], L=q[2], S=k[2], E=q[3], Ev=v[3])


def check_params(params: AttentionParams) -> None:
    """Reject options the contract does not define."""
    if params.normalizer not in normalizers.NORMALIZER_NAMES:
        raise InvalidInput(
            f"normalizer must be one of {', '.join(normalizers.NORMALIZER_NAMES)}; got {params.normalizer!r}",
            ("normalizer",),
        )
    if params.normalizer == "entmax" and (params.alpha is None or not math.isfinite(params.alpha) or params.alpha <= 1):
        raise InvalidInput("normalizer 'entmax' needs a finite alpha > 1 (alpha = 1 is softmax)", ("alpha",))
    if params.scale is not None and not (math.isfinite(params.scale) and params.scale > 0):
        raise InvalidInput(f"scale must be a finite number > 0, got {params.scale}", ("scale",))
    if not (math.isfinite(params.temperature) and params.temperature > 0):
        raise InvalidInput(f"temperature must be a finite number > 0, got {params.temperature}", ("temperature",))
    if params.causal not in (None, "top_left", "bottom_right"):
        raise InvalidInput(
            f"causal must be false, true, 'top_left' or 'bottom_right'; got {params.causal!r}", ("causal",)
        )


def resolved_scale(params: AttentionParams, head_dim: int) -> float:
    """The scale a request runs at: its own, or ``1/sqrt(E)`` when it gives none (the contract's "The forward pass")."""
    return params.scale if params.scale is not None else 1.0 / math.sqrt(head_dim)
