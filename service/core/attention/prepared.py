"""One attention call made ready to compute: validated, cast, masks combined, heads grouped.

:func:`prepare` is the step the forward pass, the backward pass and the analysis sweep share. It
checks the options and shapes, casts Q, K and V to the compute dtype, combines every mask into one
keep mask and one additive bias (already divided by the temperature), and views the query heads
that share a key/value head (grouped-query attention, PyTorch's ``enable_gqa`` repeat-interleave
order) as one axis, so that a chunk of rows is one batched GEMM (:mod:`.chunks`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from service.core.attention.checks import COMPUTE_DTYPES, Dims, check_dims, check_params, promote_to_4d, resolved_scale
from service.core.attention.numerics import scaled_bias, score_factor
from service.core.errors import InvalidInput
from service.core.masks import causal_keep, combine_keep, split_mask, valid_key_counts
from service.core.types import AttentionInputs, AttentionParams, Causal

# A causal-only mask of at most this many positions (L * S) is built once per (L, S, alignment) and shared.
CACHED_CAUSAL_POSITIONS = 1 << 15


@dataclass(slots=True)
class Prepared:
    """One validated attention call in the compute dtype, laid out for chunks of query rows."""

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    dims: Dims
    valid_keys: np.ndarray
    factor: np.floating  # scale / temperature in the compute dtype, or float64 where that underflows (score_factor)
    scale: float
    temperature: float
    q5: np.ndarray  # q viewed as (B, Hkv, G, L, E)
    drop5: np.ndarray | None  # True = masked out, as (B|1, Hkv|1, G|1, L|1, S|1)
    bias5: np.ndarray | None  # additive bias already divided by the temperature, same layout
    raw_bias5: np.ndarray | None  # the additive bias as given (relu: its weights ignore the temperature)


def split_heads(x: np.ndarray, d: Dims) -> np.ndarray:
    """View a (B, Hq, L, X) array as (B, Hkv, G, L, X)."""
    return x.reshape(x.shape[0], d.Hkv, d.group, x.shape[2], x.shape[3])


def mask5(a: np.ndarray | None, d: Dims) -> np.ndarray | None:
    """A rank-4 broadcastable mask as rank 5 (B|1, Hkv|1, G|1, L|1, S|1)."""
    if a is None:
        return None
    if a.shape[1] == 1:
        return a.reshape(a.shape[0], 1, 1, a.shape[2], a.shape[3])
    return split_heads(a, d)


@lru_cache(maxsize=64)
def cached_causal_keep(L: int, S: int, causal: Causal) -> np.ndarray:
    """The (1, 1, L, S) causal keep mask alone, for small sizes (read-only: shared by the requests of one size)."""
    keep = causal_keep(L, S, causal).reshape(1, 1, L, S)
    keep.flags.writeable = False
    return keep


def _as_compute(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    return np.ascontiguousarray(x, dtype=dtype)


def _as_operand(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Keys or values in the compute dtype for the matmuls, which read them one (S, E) block per head: an array whose
    last two axes are already C-contiguous is used as it is, whatever its leading strides (an attention session's
    cache is a view of a larger buffer: copying it would double the bytes a decode step moves). The same blocks reach
    the same BLAS calls, so the numbers are those of a contiguous copy.
    """
    if (
        x.dtype == dtype
        and x.ndim >= 2
        and x.strides[-1] == x.itemsize
        and x.strides[-2] == x.shape[-1] * x.itemsize
        and x.flags.aligned
    ):
        return x
    return np.ascontiguousarray(x, dtype=dtype)


def prepare(inputs: AttentionInputs, params: AttentionParams, dtype: np.dtype) -> Prepared:
    """Validate one call and lay it out for :mod:`.chunks` (module docstring)."""
    dtype = np.dtype(dtype)
    if dtype not in COMPUTE_DTYPES:
        raise InvalidInput(f"precision must be float32 or float64, got {dtype}", ("precision",))
    check_params(params)
    dims = check_dims(inputs.query.shape, inputs.key.shape, inputs.value.shape)
    q = _as_compute(promote_to_4d(inputs.query), dtype)
    k = _as_operand(promote_to_4d(inputs.key), dtype)
    v = _as_operand(promote_to_4d(inputs.value), dtype)
    target = dims.weights_shape
    keep, raw_bias = split_mask(inputs.mask, target)
    causal_only = keep is None and raw_bias is None and inputs.key_lengths is None and params.causal is not None
    if causal_only and dims.L * dims.S <= CACHED_CAUSAL_POSITIONS:
        keep = cached_causal_keep(dims.L, dims.S, params.causal)  # what combine_keep gives, built once per size
    else:
        keep = combine_keep(
            keep, raw_bias, causal=params.causal, key_lengths=inputs.key_lengths, batch=dims.B, L=dims.L, S=dims.S
        )
    # relu's weights do not depend on the temperature, so only the other normalizers refuse a
    # bias / temperature or scale / temperature that overflows the compute dtype.
    relu = params.normalizer == "relu"
    bias = None if raw_bias is None else scaled_bias(raw_bias, params.temperature, dtype, check=not relu)
    drop = None if keep is None else ~keep
    scale = resolved_scale(params, dims.E)
    if relu:  # unused by relu's weights (its scores are formed in float64 without the temperature)
        factor: np.floating = np.float64(scale / params.temperature)
    else:
        factor = score_factor(scale, params.temperature, dtype)
    return Prepared(
        q=q,
        k=k,
        v=v,
        dims=dims,
        valid_keys=valid_key_counts(keep, target),
        factor=factor,
        scale=scale,
        temperature=params.temperature,
        q5=split_heads(q, dims),
        drop5=mask5(drop, dims),
        bias5=mask5(bias, dims),
        raw_bias5=mask5(None if raw_bias is None else np.asarray(raw_bias, dtype=dtype), dims) if relu else None,
    )
