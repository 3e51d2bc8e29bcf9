"""Masks: boolean, additive float, causal (two alignments) and key padding.

Masks combine by selection: a position is kept only if every mask keeps it
(docs/concepts/masks.md). Booleans follow PyTorch: True means "may attend".
"""

from __future__ import annotations

import numpy as np

from service.core.errors import InvalidInput
from service.core.types import BoolArray, Causal, FloatArray, IntArray


def causal_keep(L: int, S: int, alignment: Causal) -> BoolArray:
    """Boolean ``(L, S)`` causal mask.

    ``top_left`` is PyTorch's ``is_causal=True`` (query i sees key j iff
    ``j <= i``); ``bottom_right`` is PyTorch's ``causal_lower_right`` used when
    decoding with a cache (``j <= i + S - L``).
    """
    if alignment == "top_left":
        offset = 0
    elif alignment == "bottom_right":
        offset = S - L
    else:
        raise InvalidInput(f"causal must be 'top_left' or 'bottom_right', got {alignment!r}", ("causal",))
    return np.tri(L, S, k=offset, dtype=bool)


def key_length_keep(key_lengths: np.ndarray, batch: int, S: int) -> BoolArray:
    """Boolean ``(B, 1, 1, S)`` key padding mask: key j of batch b is valid iff ``j < key_lengths[b]``."""
    lengths = np.asarray(key_lengths)
    if lengths.ndim != 1 or lengths.shape[0] != batch:
        raise InvalidInput(
            f"key_lengths has {lengths.size} entries but the batch size B is {batch}",
            ("key_lengths",),
        )
    if lengths.size and not np.issubdtype(lengths.dtype, np.integer):
        raise InvalidInput("key_lengths must be integers", ("key_lengths",))
    bad = np.flatnonzero((lengths < 0) | (lengths > S))
    if bad.size:
        i = int(bad[0])
        raise InvalidInput(
            f"key_lengths[{i}] = {int(lengths[i])} is outside [0, S] with S = {S}",
            ("key_lengths", i),
        )
    return (np.arange(S) < lengths[:, None]).reshape(batch, 1, 1, S)


def as_4d_mask(mask: np.ndarray, target: tuple[int, int, int, int]) -> np.ndarray:
    """View ``mask`` with rank 4, checking it broadcasts to ``target`` = (B, Hq, L, S)."""
    if mask.ndim > 4:
        raise InvalidInput(f"mask has rank {mask.ndim}; at most 4 is allowed", ("mask",))
    m4 = mask.reshape((1,) * (4 - mask.ndim) + mask.shape)
    names = ("B", "Hq", "L", "S")
    for axis, (have, want) in enumerate(zip(m4.shape, target, strict=True)):
        if have not in (1, want):
            dim = axis - (4 - mask.ndim)
            raise InvalidInput(
                f"mask has {names[axis]}={have} but the attention has {names[axis]}={want}; "
                f"mask shape {tuple(mask.shape)} must broadcast to {target}",
                ("mask", "shape", max(dim, 0)),
            )
    return m4


def split_mask(
    mask: np.ndarray | None, target: tuple[int, int, int, int]
) -> tuple[BoolArray | None, FloatArray | None]:
    """Split a user mask into (boolean keep, additive float bias), both rank 4 and broadcastable."""
    if mask is None:
        return None, None
    m4 = as_4d_mask(np.asarray(mask), target)
    if m4.dtype == bool:
        return m4, None
    if not np.issubdtype(m4.dtype, np.floating):
        raise InvalidInput(f"mask must be boolean or floating point, got {m4.dtype}", ("mask",))
    if np.isnan(m4).any() or np.isposinf(m4).any():
        raise InvalidInput("a float mask may hold finite numbers or -inf, not NaN or +inf", ("mask",))
    return None, m4


def keep_mask(
    batch: int,
    heads: int,
    L: int,
    S: int,
    *,
    mask: np.ndarray | None = None,
    causal: Causal | None = None,
    key_lengths: np.ndarray | None = None,
) -> BoolArray | None:
    """Combined boolean keep-mask, broadcastable to ``(B, Hq, L, S)``; None when nothing masks.

    A float ``mask`` contributes its ``-inf`` entries (positions it removes);
    its finite values are a bias, not a mask, and are not represented here.
    """
    keep, bias = split_mask(mask, (batch, heads, L, S))
    return combine_keep(keep, bias, causal=causal, key_lengths=key_lengths, batch=batch, L=L, S=S)


def combine_keep(
    keep: BoolArray | None,
    bias: FloatArray | None,
    *,
    causal: Causal | None,
    key_lengths: np.ndarray | None,
    batch: int,
    L: int,
    S: int,
) -> BoolArray | None:
    """AND together a boolean keep-mask, the ``-inf`` entries of a float bias, causal and key padding.

    Rank-4 broadcastable result; None when nothing masks.
    """
    parts = [keep]
    if bias is not None and np.isneginf(bias).any():
        parts.append(~np.isneginf(bias))
    if causal is not None:
        parts.append(causal_keep(L, S, causal).reshape(1, 1, L, S))
    if key_lengths is not None:
        parts.append(key_length_keep(key_lengths, batch, S))
    present = [p for p in parts if p is not None]
    if not present:
        return None
    combined = present[0]
    for p in present[1:]:
        combined = combined & p
    return combined


def valid_key_counts(keep: BoolArray | None, target: tuple[int, int, int, int]) -> IntArray:
    """Number of keys each query row may attend, shape ``(B, Hq, L)`` (int64)."""
    B, H, L, S = target
    if keep is None:
        return np.full((B, H, L), S, dtype=np.int64)
    counts = keep.sum(axis=-1, dtype=np.int64)
    if keep.shape[-1] == 1 and S != 1:
        counts = counts * S
    return np.ascontiguousarray(np.broadcast_to(counts, (B, H, L)))
