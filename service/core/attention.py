"""Scaled dot-product attention with pluggable normalizers, and its backward.

The pipeline is semantics.md's, in order: ``scores = scale * Q K^T``, add the
mask bias (booleans select, floats add), divide by the temperature, normalize
over the key axis, ``output = A V``.

The forward pass works on chunks of query rows (see :func:`_chunks`): the
query heads that share a key/value head (grouped-query attention, PyTorch's
``enable_gqa`` repeat-interleave order) are stacked so each chunk is one
batched GEMM, the normalizer runs in place on the chunk, and peak memory
beyond the result is one chunk per thread.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from service.core import normalizers
from service.core.errors import InvalidInput, NumericalError
from service.core.masks import causal_keep, combine_keep, split_mask, valid_key_counts
from service.core.types import (
    AttentionInputs,
    AttentionParams,
    AttentionResult,
    AttentionTask,
    Causal,
    FloatArray,
)

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
    """Check the shapes agree (semantics.md, "Shapes") and return the sizes.

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
    """The scale a request runs at: its own, or ``1/sqrt(E)`` when it gives none (semantics.md, "Pipeline")."""
    return params.scale if params.scale is not None else 1.0 / math.sqrt(head_dim)


def widened_factor(factor: float | np.floating, dtype: np.dtype | type) -> bool:
    """Whether :func:`score_factor` gave ``factor`` in float64 because ``dtype`` cannot hold it as a normal number."""
    return bool(np.asarray(factor).dtype != np.dtype(dtype))


def overflow_error(dtype: np.dtype | type, what: str = "the scores") -> NumericalError:
    """The 422 for a result that does not fit the compute dtype (never a silent dead row or a null)."""
    name = np.dtype(dtype).name
    hint = "retry with precision float64 or smaller inputs" if name != "float64" else "use smaller inputs"
    return NumericalError(
        f"{what} overflow {name} (|(scale * q.k + bias) / temperature| > {float(np.finfo(dtype).max):.3g} at a "
        f"position no mask removes); {hint}"
    )


def _wider(dtype: np.dtype | type) -> str:
    """``"precision float64 or "`` where float64 would help, nothing where it is already in force."""
    return "precision float64 or " if np.dtype(dtype) != np.float64 else ""


@lru_cache(maxsize=256)
def score_factor(scale: float, temperature: float, dtype: np.dtype | type) -> np.floating:
    """``scale / temperature`` (computed in float64), the scalar Q is multiplied by, rounded once to ``dtype``.

    Where the rounded factor would not be a normal number of ``dtype`` (float32 below 1.2e-38: 0 or a
    subnormal with few significant bits), the float64 quotient is returned instead, so that products
    with it are formed in float64 and rounded once: ``scale: 1e-25, temperature: 1e24`` on queries and
    keys of 1e22 gives scores of 1e-5, not 0. A factor that overflows is a :class:`NumericalError`
    (every score would be infinite). Cached (errors are not).
    """
    factor = scale / temperature
    dtype = np.dtype(dtype)
    with np.errstate(over="ignore", under="ignore"):
        rounded: np.floating = dtype.type(factor)
    if not np.isfinite(rounded):
        raise NumericalError(
            f"scale / temperature = {factor:.3g} overflows {dtype.name}; use {_wider(dtype)}a larger temperature"
        )
    if abs(rounded) < np.finfo(dtype).tiny:
        return np.float64(factor)
    return rounded


def scaled_bias(bias: np.ndarray, temperature: float, dtype: np.dtype | type, *, check: bool = True) -> np.ndarray:
    """A float mask divided by the temperature: divided in float64 and rounded once to ``dtype``.

    ``-inf`` (a masked position) stays ``-inf``. A finite entry whose quotient does not fit ``dtype`` is a
    :class:`NumericalError` (``check``): turning it into ``-inf`` would mask the position, and a row whose
    every entry overflowed would silently become a dead row. With a temperature of 1 and ``bias`` already
    in ``dtype``, ``bias`` itself is returned (dividing by 1 and rounding back change nothing): read it only.
    """
    dtype = np.dtype(dtype)
    if temperature == 1.0 and isinstance(bias, np.ndarray) and bias.dtype == dtype:
        return bias
    with np.errstate(over="ignore", under="ignore"):
        quotient = np.asarray(bias, dtype=np.float64) / float(temperature)
        out = quotient.astype(dtype)
    if check and not np.isfinite(out).all():
        bad = np.isfinite(bias) & ~np.isfinite(out)
        if bad.any():
            idx = np.unravel_index(int(np.flatnonzero(bad)[0]), bad.shape)
            raise NumericalError(
                f"the float mask divided by the temperature overflows {dtype.name} "
                f"(a mask entry / temperature = {float(quotient[idx]):.3g}); "
                f"use {_wider(dtype)}a larger temperature"
            )
    return out


def check_scores_finite(scores: np.ndarray, keep: np.ndarray | None, dtype: np.dtype | type) -> None:
    """Scores returned to the client must be finite wherever no mask removes the position (``-inf`` = masked)."""
    if np.isfinite(scores).all():
        return
    bad = ~np.isfinite(scores)
    if keep is not None:
        bad &= keep
    if bad.any():
        raise overflow_error(dtype)


def check_live_rows(dead: np.ndarray, valid_keys: np.ndarray, dtype: np.dtype | type) -> None:
    """``dead`` (rows whose scores are all ``-inf``) may only hold rows that every mask removed.

    A row with valid keys whose scores all overflowed to ``-inf`` would otherwise be answered as a
    fully masked row (zeros), silently.
    """
    if dead.any() and (dead & (valid_keys > 0)).any():
        raise overflow_error(dtype)


def _as_compute(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    return np.ascontiguousarray(x, dtype=dtype)


@dataclass(slots=True)
class _Prepared:
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


@lru_cache(maxsize=64)
def _causal_keep(L: int, S: int, causal: Causal) -> np.ndarray:
    """The (1, 1, L, S) causal keep mask alone, for small sizes (read-only: shared by the requests of one size)."""
    keep = causal_keep(L, S, causal).reshape(1, 1, L, S)
    keep.flags.writeable = False
    return keep


def _prepare(inputs: AttentionInputs, params: AttentionParams, dtype: np.dtype) -> _Prepared:
    dtype = np.dtype(dtype)
    if dtype not in COMPUTE_DTYPES:
        raise InvalidInput(f"precision must be float32 or float64, got {dtype}", ("precision",))
    check_params(params)
    dims = check_dims(inputs.query.shape, inputs.key.shape, inputs.value.shape)
    q = _as_compute(promote_to_4d(inputs.query), dtype)
    k = _as_compute(promote_to_4d(inputs.key), dtype)
    v = _as_compute(promote_to_4d(inputs.value), dtype)
    target = dims.weights_shape
    keep, raw_bias = split_mask(inputs.mask, target)
    causal_only = keep is None and raw_bias is None and inputs.key_lengths is None and params.causal is not None
    if causal_only and dims.L * dims.S <= FAST_PATH_SCORES:
        keep = _causal_keep(dims.L, dims.S, params.causal)  # what combine_keep gives, built once per size
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
    return _Prepared(
        q=q,
        k=k,
        v=v,
        dims=dims,
        valid_keys=valid_key_counts(keep, target),
        factor=factor,
        scale=scale,
        temperature=params.temperature,
        q5=_split_heads(q, dims),
        drop5=_mask5(drop, dims),
        bias5=_mask5(bias, dims),
        raw_bias5=_mask5(None if raw_bias is None else np.asarray(raw_bias, dtype=dtype), dims) if relu else None,
    )


# Scores per chunk (2 MiB of float32). Measured on the benchmark machine:
# larger chunks keep the GEMMs efficient, smaller ones the softmax passes in
# cache; 2**19 was best for (4, 12, 512, 64), and chunks below 2**15 lose to
# per-call overhead.
CHUNK_ELEMENTS = 1 << 19
MIN_CHUNK_ELEMENTS = 1 << 15
# Below this many scores in all, handing chunks to threads costs more than it saves.
PARALLEL_MIN_ELEMENTS = 1 << 16


@dataclass(frozen=True, slots=True)
class _Chunk:
    """Query rows of one batch ``b``: kv heads ``kv``, groups ``g`` and rows ``l``.

    At most one of the three ranges is partial, and only the innermost
    non-full one, so every slice of a C-contiguous (B, Hkv, G, L, X) array for
    a chunk is contiguous and reshapes to (kv heads, rows, X) without a copy.
    """

    b: int
    kv: slice
    g: slice
    l: slice  # noqa: E741 -- the query-length axis L, as in (B, H, L, S)


def _chunks(d: Dims, budget: int) -> list[_Chunk]:
    """Split the work into chunks of about ``budget`` scores (at least one row each)."""
    G, L, S = d.group, d.L, d.S
    all_g, all_l = slice(0, G), slice(0, L)
    chunks: list[_Chunk] = []
    for b in range(d.B):
        if G * L * S <= budget:  # several whole kv heads
            n = budget // (G * L * S)
            chunks += [_Chunk(b, slice(kv, min(kv + n, d.Hkv)), all_g, all_l) for kv in range(0, d.Hkv, n)]
        elif L * S <= budget:  # several query heads of one kv head
            n = budget // (L * S)
            chunks += [
                _Chunk(b, slice(kv, kv + 1), slice(g, min(g + n, G)), all_l)
                for kv in range(d.Hkv)
                for g in range(0, G, n)
            ]
        else:  # rows of one query head
            n = max(1, budget // S)
            chunks += [
                _Chunk(b, slice(kv, kv + 1), slice(g, g + 1), slice(l, min(l + n, L)))
                for kv in range(d.Hkv)
                for g in range(G)
                for l in range(0, L, n)  # noqa: E741 -- rows along the query-length axis L
            ]
    return chunks


def _split_heads(x: np.ndarray, d: Dims) -> np.ndarray:
    """View a (B, Hq, L, X) array as (B, Hkv, G, L, X)."""
    return x.reshape(x.shape[0], d.Hkv, d.group, x.shape[2], x.shape[3])


def _mask5(a: np.ndarray | None, d: Dims) -> np.ndarray | None:
    """A rank-4 broadcastable mask as rank 5 (B|1, Hkv|1, G|1, L|1, S|1)."""
    if a is None:
        return None
    if a.shape[1] == 1:
        return a.reshape(a.shape[0], 1, 1, a.shape[2], a.shape[3])
    return _split_heads(a, d)


def _mask_chunk(a: np.ndarray | None, c: _Chunk) -> np.ndarray | None:
    """The part of a rank-5 broadcastable mask that covers chunk ``c``."""
    if a is None:
        return None
    every = slice(None)
    return a[
        c.b if a.shape[0] > 1 else 0,
        c.kv if a.shape[1] > 1 else every,
        c.g if a.shape[2] > 1 else every,
        c.l if a.shape[3] > 1 else every,
    ]


def _chunk_rows(x5: np.ndarray, c: _Chunk) -> np.ndarray:
    """The (kv heads, rows, X) view of a C-contiguous (B, Hkv, G, L, X) array for chunk ``c``."""
    part = x5[c.b, c.kv, c.g, c.l]
    rows = part.reshape(part.shape[0], part.shape[1] * part.shape[2], part.shape[3])
    return rows


def _chunk_scores(p: _Prepared, c: _Chunk, out: np.ndarray, *, check: bool = False) -> None:
    """Write the normalizer input ``(scale*QK^T + bias)/T`` of chunk ``c`` into ``out`` (kv heads, rows, S).

    ``check``: a score that overflowed at a kept position is a :class:`NumericalError` (checked before
    the masked positions become ``-inf``, so the usual all-finite chunk costs one cheap pass).
    """
    q = p.q5[c.b, c.kv, c.g, c.l]
    q = (q * p.factor).reshape(out.shape[0], out.shape[1], p.dims.E)  # scaling Q is cheaper than the scores
    np.matmul(q, p.k[c.b, c.kv].transpose(0, 2, 1), out=out)
    z4 = out.reshape(q.shape[0], c.g.stop - c.g.start, c.l.stop - c.l.start, p.dims.S)
    bias = _mask_chunk(p.bias5, c)
    if bias is not None:
        z4 += bias
    drop = _mask_chunk(p.drop5, c)
    if check:
        check_scores_finite(z4, None if drop is None else ~drop, out.dtype)
    if drop is not None:
        np.copyto(z4, -np.inf, where=drop)


def _exp_shifted(z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """In place ``z <- exp(z - rowmax)``; returns the row sums, with 0 (fully masked rows) replaced by 1,
    and which rows had no finite score (all ``-inf``).
    """
    m = z.max(axis=-1, keepdims=True)
    dead = m == -np.inf  # np.isneginf is three ufunc calls
    m[dead] = 0  # a fully masked row: exp(-inf - 0) = 0, not exp(-inf + inf) = NaN
    z -= m
    np.exp(z, out=z)
    s: np.ndarray = z.sum(axis=-1, keepdims=True)
    s[dead] = 1  # the rows summing to 0: any other row holds exp(0) = 1 (or a NaN)
    return s, dead[..., 0]


def _chunk_valid(p: _Prepared, c: _Chunk) -> np.ndarray:
    """Valid key counts of chunk ``c``'s rows, as (kv heads, rows)."""
    d = p.dims
    part = p.valid_keys.reshape(d.B, d.Hkv, d.group, d.L)[c.b, c.kv, c.g, c.l]
    return part.reshape(part.shape[0], -1)


def _chunk_keep(p: _Prepared, c: _Chunk) -> np.ndarray | None:
    """The keep mask of chunk ``c`` as a (kv heads|1, groups|1, rows|1, S|1) broadcastable array."""
    drop = _mask_chunk(p.drop5, c)
    return None if drop is None else ~drop


def _relu_weights(
    p: _Prepared,
    q: np.ndarray,
    k: np.ndarray,
    bias: np.ndarray | None,
    drop: np.ndarray | None,
    scores_out: np.ndarray | None,
) -> np.ndarray:
    """ReLU weights (..., G * L, S) in float64 from ``y = scale * Q K^T + bias``, for queries ``q``
    (..., G, L, E) against keys ``k`` (..., S, E); ``bias`` and ``drop`` broadcast to (..., G, L, S).

    ``relu(y / T) / sum relu(y / T)`` does not depend on T > 0, so the temperature is left out (a
    temperature of 1e300, or one that makes the scores overflow, cannot turn a row into zeros), and y is
    formed in float64, where a float32 request's scores can neither overflow nor underflow. The row is
    then scaled by its largest value before summing (semantics.md; :func:`normalizers.relu_normalize`).
    ``scores_out`` (when given, shaped as the weights) receives the scores ``y / T`` rounded to its dtype.
    """
    y = _relu_scores(p, q, k, bias, drop)
    if scores_out is not None:
        scores_out[...] = y / p.temperature
        grouped = scores_out.reshape(q.shape[:-1] + (y.shape[-1],))
        check_scores_finite(grouped, None if drop is None else ~drop, scores_out.dtype)
    return normalizers.relu_normalize(y)


def _relu_scores(
    p: _Prepared, q: np.ndarray, k: np.ndarray, bias: np.ndarray | None, drop: np.ndarray | None
) -> np.ndarray:
    """``y = scale * Q K^T + bias`` in float64 as (..., G * L, S), ``-inf`` where ``drop``: what ReLU normalizes
    (:func:`_relu_weights`; the backward pass differentiates the same numbers).
    """
    *lead, G, L, E = q.shape
    y: np.ndarray = np.matmul(q.astype(np.float64).reshape(*lead, G * L, E), k.astype(np.float64).swapaxes(-1, -2))
    y *= p.scale
    grouped = y.reshape(*lead, G, L, y.shape[-1])
    if bias is not None:
        grouped += bias
    if drop is not None:
        np.copyto(grouped, -np.inf, where=drop)
    return y


def _relu_chunk(p: _Prepared, c: _Chunk, scores_out: np.ndarray | None) -> np.ndarray:
    """ReLU weights of chunk ``c`` (kv heads, rows, S) in float64 (:func:`_relu_weights`)."""
    return _relu_weights(
        p, p.q5[c.b, c.kv, c.g, c.l], p.k[c.b, c.kv], _mask_chunk(p.raw_bias5, c), _mask_chunk(p.drop5, c), scores_out
    )


def _forward_chunk(
    p: _Prepared,
    c: _Chunk,
    normalizer: str,
    alpha: float | None,
    output5: np.ndarray,
    weights5: np.ndarray | None,
    scores5: np.ndarray | None,
) -> None:
    """Fill chunk ``c`` of the output (and of the weights and scores when given)."""
    d = p.dims
    out = _chunk_rows(output5, c)
    if weights5 is not None:
        z = _chunk_rows(weights5, c)
    else:
        z = np.empty((out.shape[0], out.shape[1], d.S), dtype=out.dtype)
    # float32 scores beyond ~3e38 overflow: reported as a NumericalError (never a dead row or a null).
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        v = p.v[c.b, c.kv]
        if normalizer == "relu":
            a = _relu_chunk(p, c, None if scores5 is None else _chunk_rows(scores5, c))
            _mix_relu(a, z, v, out, keep_weights=weights5 is not None)
            return
        _chunk_scores(p, c, z, check=scores5 is not None)
        if scores5 is not None:
            _chunk_rows(scores5, c)[...] = z
        _normalize_and_mix(z, v, out, _chunk_valid(p, c), normalizer, alpha, keep_weights=weights5 is not None)


def _mix_relu(a: np.ndarray, z: np.ndarray, v: np.ndarray, out: np.ndarray, *, keep_weights: bool) -> None:
    """``out = A v`` for ReLU weights ``a`` computed in float64 (:func:`_relu_weights`), in ``out``'s dtype; with
    ``keep_weights`` they are stored in ``z`` first and the product uses those (the weights the answer returns).
    """
    if keep_weights:
        z[...] = a
        np.matmul(z, v, out=out)
    else:
        np.matmul(a.astype(out.dtype), v, out=out)


def _normalize_and_mix(
    z: np.ndarray,
    v: np.ndarray,
    out: np.ndarray,
    valid: np.ndarray,
    normalizer: str,
    alpha: float | None,
    *,
    keep_weights: bool,
) -> None:
    """From the masked scores ``z`` (..., kv heads, rows, S; masked = -inf) to ``out = A v``: the step both
    forward paths share. ``valid`` counts each row's valid keys (``z``'s shape without S). With
    ``keep_weights`` the weights A are left in ``z``; else softmax normalizes the (rows, Ev) output
    instead of the (rows, S) weights. A leading batch axis is normalized one batch at a time, as the
    chunked path does: the bisection's row blocks depend on the rows they hold.
    """
    if normalizer == "softmax":
        sums, dead = _exp_shifted(z)
        check_live_rows(dead, valid, z.dtype)
        if keep_weights:
            z /= sums
            np.matmul(z, v, out=out)
        else:
            np.matmul(z, v, out=out)
            out /= sums
        return
    check_live_rows(z.max(axis=-1) == -np.inf, valid, z.dtype)
    if z.ndim == 3:
        a = normalizers.normalize(z, normalizer, alpha=alpha)
    elif z.shape[0] == 1:
        a = normalizers.normalize(z[0], normalizer, alpha=alpha)[None]
    else:
        a = np.empty_like(z)
        for b in range(z.shape[0]):
            normalizers.normalize(z[b], normalizer, alpha=alpha, out=a[b])
    if keep_weights:
        z[...] = a
    np.matmul(a, v, out=out)


# Up to this many scores (B*Hq*L*S) in all, run_attention computes the whole task in one pass
# (:func:`_forward_small`) instead of planning and iterating chunks: a (1, 1, 4, 4) request spends
# most of its time in per-call Python overhead, not in arithmetic. At most MIN_CHUNK_ELEMENTS, so the
# chunked path would run each batch as one chunk too, and below PARALLEL_MIN_ELEMENTS (no threads).
FAST_PATH_SCORES = 1 << 15


def _forward_small(
    p: _Prepared,
    normalizer: str,
    alpha: float | None,
    output: np.ndarray,
    weights: np.ndarray | None,
    scores: np.ndarray | None,
) -> None:
    """Fill ``output`` (and ``weights``, ``scores``) for the whole task at once.

    The same operations in the same order as :func:`_forward_chunk` on one chunk per batch, on arrays
    with a leading batch axis: element-wise steps and row reductions give the same numbers for every
    row, and ``matmul`` of a stack runs the same GEMM on each (B, Hkv) matrix. So the results are
    bit-identical to the chunked path (``tests/core/test_attention_fast.py``). The sort-based and
    bisection normalizers get one batch at a time, as there: the bisection's row blocks depend on
    the rows they hold.
    """
    d = p.dims
    B, Hkv, GL, S = d.B, d.Hkv, d.group * d.L, d.S
    dtype = output.dtype
    out = output.reshape(B, Hkv, GL, d.Ev)
    z = np.empty((B, Hkv, GL, S), dtype=dtype) if weights is None else weights.reshape(B, Hkv, GL, S)
    z5 = z.reshape(B, Hkv, d.group, d.L, S)
    drop5 = p.drop5
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        if normalizer == "relu":  # as _relu_chunk: float64 scores, no temperature
            a = _relu_weights(p, p.q5, p.k, p.raw_bias5, drop5, None if scores is None else scores.reshape(z.shape))
            _mix_relu(a, z, p.v, out, keep_weights=weights is not None)
            return
        np.matmul((p.q5 * p.factor).reshape(B, Hkv, GL, d.E), p.k.transpose(0, 1, 3, 2), out=z)
        if p.bias5 is not None:
            z5 += p.bias5
        if scores is not None:
            check_scores_finite(z5, None if drop5 is None else ~drop5, dtype)
        if drop5 is not None:
            np.copyto(z5, -np.inf, where=drop5)
        if scores is not None:
            scores.reshape(z.shape)[...] = z
        _normalize_and_mix(
            z, p.v, out, p.valid_keys.reshape(B, Hkv, GL), normalizer, alpha, keep_weights=weights is not None
        )


def run_attention(task: AttentionTask, *, executor: Executor | None = None, workers: int = 1) -> AttentionResult:
    """Run attention on numpy; the reference implementation of semantics.md.

    A task of at most :data:`FAST_PATH_SCORES` scores runs in one pass
    (:func:`_forward_small`, bit-identical to the chunked path). Larger ones are
    split into chunks of query rows (at most :data:`CHUNK_ELEMENTS`
    scores each) so that peak memory beyond the result is one chunk per
    thread. With an ``executor`` of ``workers`` threads (BLAS then best limited
    to one thread, as :class:`~service.engines.numpy_engine.NumpyEngine` does),
    requests of at least :data:`PARALLEL_MIN_ELEMENTS` scores are cut into at
    least ``workers`` chunks that run in parallel.

    Raises :class:`InvalidInput` for inputs the contract rejects and
    :class:`NumericalError` when a result would not be finite (float32 scores
    that overflow: retry with float64).
    """
    params = task.params
    p = _prepare(task.inputs, params, task.dtype)
    d = p.dims
    dtype = p.q.dtype
    output = np.empty((d.B, d.Hq, d.L, d.Ev), dtype=dtype)
    weights = np.empty(d.weights_shape, dtype=dtype) if task.need_weights else None
    scores = np.empty(d.weights_shape, dtype=dtype) if task.need_scores else None
    total = d.B * d.Hq * d.L * d.S
    if total <= FAST_PATH_SCORES:
        _forward_small(p, params.normalizer, params.alpha, output, weights, scores)
    else:
        _forward_chunked(p, params, output, weights, scores, executor, workers)
    if not np.isfinite(output).all():
        raise overflow_error(dtype, "the attention output is not finite: the scores")
    rank = task.inputs.query.ndim
    lead = task.inputs.query.shape[:-1]
    return AttentionResult(
        output=output.reshape(lead + (d.Ev,)) if rank < 4 else output,
        weights=None if weights is None else weights.reshape(lead + (d.S,)),
        scores=None if scores is None else scores.reshape(lead + (d.S,)),
        valid_keys=p.valid_keys,
    )


def _forward_chunked(
    p: _Prepared,
    params: AttentionParams,
    output: np.ndarray,
    weights: np.ndarray | None,
    scores: np.ndarray | None,
    executor: Executor | None,
    workers: int,
) -> None:
    """Fill the results chunk by chunk (:func:`_chunks`), on ``executor`` when the task is large enough."""
    d = p.dims
    output5 = _split_heads(output, d)
    weights5 = None if weights is None else _split_heads(weights, d)
    scores5 = None if scores is None else _split_heads(scores, d)

    def work(c: _Chunk) -> None:
        _forward_chunk(p, c, params.normalizer, params.alpha, output5, weights5, scores5)

    run_chunks(d, work, executor, workers)


def run_chunks(d: Dims, work: Callable[[_Chunk], None], executor: Executor | None, workers: int) -> None:
    """Call ``work`` on every chunk of query rows of a task of sizes ``d`` (the forward and backward passes).

    A task of at least :data:`PARALLEL_MIN_ELEMENTS` scores, given an ``executor`` of ``workers > 1``
    threads, is cut into about one chunk per worker (at least :data:`MIN_CHUNK_ELEMENTS` scores each)
    and run there; otherwise into chunks of :data:`CHUNK_ELEMENTS` scores, in turn on this thread.
    """
    total = d.B * d.Hq * d.L * d.S
    parallel = executor is not None and workers > 1 and total >= PARALLEL_MIN_ELEMENTS
    budget = max(MIN_CHUNK_ELEMENTS, min(CHUNK_ELEMENTS, -(-total // workers))) if parallel else CHUNK_ELEMENTS
    chunks = _chunks(d, budget)
    if parallel and len(chunks) > 1:
        assert executor is not None
        for _ in executor.map(work, chunks):
            pass
    else:
        for c in chunks:
            work(c)


def attention(
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    *,
    mask: np.ndarray | None = None,
    key_lengths: np.ndarray | None = None,
    params: AttentionParams | None = None,
    dtype: np.dtype | type = np.float32,
    need_weights: bool = True,
    need_scores: bool = False,
) -> AttentionResult:
    """Library entry point: attention on numpy arrays (see :func:`run_attention`)."""
    task = AttentionTask(
        inputs=AttentionInputs(query=query, key=key, value=value, mask=mask, key_lengths=key_lengths),
        params=params or AttentionParams(),
        dtype=np.dtype(dtype),
        need_weights=need_weights,
        need_scores=need_scores,
    )
    return run_attention(task)


@dataclass(slots=True)
class AttentionGradients:
    """Gradients of ``sum(output * grad_output)`` with respect to the inputs, in their shapes."""

    grad_query: FloatArray
    grad_key: FloatArray
    grad_value: FloatArray


def attention_backward(task: AttentionTask, grad_output: np.ndarray) -> AttentionGradients:
    """Gradients of ``sum(output * grad_output)`` with respect to query, key and value (semantics.md, "Gradients").

    ``dV = A^T dO``, ``dA = dO V^T``, ``dZ = backward(dA)``, and with ``dS = dZ/T``:
    ``dQ = scale * dS K``, ``dK = scale * dS^T Q``. Query heads sharing a
    key/value head add their contributions to it. The whole backward pass (mask,
    scale and temperature gradients, gradient health) is
    :func:`service.core.backward.run_backward`.
    """
    from service.core.backward import BackwardTask, run_backward  # backward builds on this module

    r = run_backward(BackwardTask(task, grad_output))
    assert r.grad_query is not None and r.grad_key is not None and r.grad_value is not None
    return AttentionGradients(r.grad_query, r.grad_key, r.grad_value)
