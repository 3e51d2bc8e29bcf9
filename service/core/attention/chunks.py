"""Chunks of query rows: the unit of work of the forward and backward passes and of the analysis sweep.

A :class:`Chunk` is query rows of one batch (kv heads, groups and rows), planned so that every slice of
a C-contiguous (B, Hkv, G, L, X) array for it is contiguous: each chunk is one batched GEMM, the
normalizer runs on it in place, and peak memory beyond the result is one chunk per thread.
:func:`run_chunks` calls a function on every chunk, on threads for large tasks; :func:`chunk_scores`
and :func:`relu_scores` form a chunk's normalizer input.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass

import numpy as np

from service.core.attention.checks import Dims
from service.core.attention.numerics import check_scores_finite
from service.core.attention.prepared import Prepared

# Scores per chunk (2 MiB of float32). Measured on the benchmark machine:
# larger chunks keep the GEMMs efficient, smaller ones the softmax passes in
# cache; 2**19 was best for (4, 12, 512, 64), and chunks below 2**15 lose to
# per-call overhead.
CHUNK_ELEMENTS = 1 << 19
MIN_CHUNK_ELEMENTS = 1 << 15
# Below this many scores in all, handing chunks to threads costs more than it saves.
PARALLEL_MIN_ELEMENTS = 1 << 16


@dataclass(frozen=True, slots=True)
class Chunk:
    """Query rows of one batch ``b``: kv heads ``kv``, groups ``g`` and rows ``l``.

    At most one of the three ranges is partial, and only the innermost
    non-full one, so every slice of a C-contiguous (B, Hkv, G, L, X) array for
    a chunk is contiguous and reshapes to (kv heads, rows, X) without a copy.
    """

    b: int
    kv: slice
    g: slice
    l: slice  # noqa: E741 -- the query-length axis L, as in (B, H, L, S)


def plan_chunks(d: Dims, budget: int) -> list[Chunk]:
    """Split the work into chunks of about ``budget`` scores (at least one row each)."""
    G, L, S = d.group, d.L, d.S
    all_g, all_l = slice(0, G), slice(0, L)
    chunks: list[Chunk] = []
    for b in range(d.B):
        if G * L * S <= budget:  # several whole kv heads
            n = budget // (G * L * S)
            chunks += [Chunk(b, slice(kv, min(kv + n, d.Hkv)), all_g, all_l) for kv in range(0, d.Hkv, n)]
        elif L * S <= budget:  # several query heads of one kv head
            n = budget // (L * S)
            chunks += [
                Chunk(b, slice(kv, kv + 1), slice(g, min(g + n, G)), all_l)
                for kv in range(d.Hkv)
                for g in range(0, G, n)
            ]
        else:  # rows of one query head
            n = max(1, budget // S)
            chunks += [
                Chunk(b, slice(kv, kv + 1), slice(g, g + 1), slice(l, min(l + n, L)))
                for kv in range(d.Hkv)
                for g in range(G)
                for l in range(0, L, n)  # noqa: E741 -- rows along the query-length axis L
            ]
    return chunks


def run_chunks(d: Dims, work: Callable[[Chunk], None], executor: Executor | None, workers: int) -> None:
    """Call ``work`` on every chunk of query rows of a task of sizes ``d`` (the forward and backward passes).

    A task of at least :data:`PARALLEL_MIN_ELEMENTS` scores, given an ``executor`` of ``workers > 1``
    threads, is cut into about one chunk per worker (at least :data:`MIN_CHUNK_ELEMENTS` scores each)
    and run there; otherwise into chunks of :data:`CHUNK_ELEMENTS` scores, in turn on this thread.
    """
    total = d.B * d.Hq * d.L * d.S
    parallel = executor is not None and workers > 1 and total >= PARALLEL_MIN_ELEMENTS
    budget = max(MIN_CHUNK_ELEMENTS, min(CHUNK_ELEMENTS, -(-total // workers))) if parallel else CHUNK_ELEMENTS
    chunks = plan_chunks(d, budget)
    if parallel and len(chunks) > 1:
        assert executor is not None
        for _ in executor.map(work, chunks):
            pass
    else:
        for c in chunks:
            work(c)


def mask_chunk(a: np.ndarray | None, c: Chunk) -> np.ndarray | None:
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


def chunk_rows(x5: np.ndarray, c: Chunk) -> np.ndarray:
    """The (kv heads, rows, X) view of a C-contiguous (B, Hkv, G, L, X) array for chunk ``c``."""
    part = x5[c.b, c.kv, c.g, c.l]
    rows = part.reshape(part.shape[0], part.shape[1] * part.shape[2], part.shape[3])
    return rows


def chunk_valid(p: Prepared, c: Chunk) -> np.ndarray:
    """Valid key counts of chunk ``c``'s rows, as (kv heads, rows)."""
    d = p.dims
    part = p.valid_keys.reshape(d.B, d.Hkv, d.group, d.L)[c.b, c.kv, c.g, c.l]
    return part.reshape(part.shape[0], -1)


def chunk_keep(p: Prepared, c: Chunk) -> np.ndarray | None:
    """The keep mask of chunk ``c`` as a (kv heads|1, groups|1, rows|1, S|1) broadcastable array."""
    drop = mask_chunk(p.drop5, c)
    return None if drop is None else ~drop


def chunk_scores(p: Prepared, c: Chunk, out: np.ndarray, *, check: bool = False) -> None:
    """Write the normalizer input ``(scale*QK^T + bias)/T`` of chunk ``c`` into ``out`` (kv heads, rows, S).

    ``check``: a score that overflowed at a kept position is a :class:`NumericalError` (checked before
    the masked positions become ``-inf``, so the usual all-finite chunk costs one cheap pass).
    """
    q = p.q5[c.b, c.kv, c.g, c.l]
    q = (q * p.factor).reshape(out.shape[0], out.shape[1], p.dims.E)  # scaling Q is cheaper than the scores
    np.matmul(q, p.k[c.b, c.kv].transpose(0, 2, 1), out=out)
    z4 = out.reshape(q.shape[0], c.g.stop - c.g.start, c.l.stop - c.l.start, p.dims.S)
    bias = mask_chunk(p.bias5, c)
    if bias is not None:
        z4 += bias
    drop = mask_chunk(p.drop5, c)
    if check:
        check_scores_finite(z4, None if drop is None else ~drop, out.dtype)
    if drop is not None:
        np.copyto(z4, -np.inf, where=drop)


def relu_scores(
    p: Prepared, q: np.ndarray, k: np.ndarray, bias: np.ndarray | None, drop: np.ndarray | None
) -> np.ndarray:
    """``y = scale * Q K^T + bias`` in float64 as (..., G * L, S), ``-inf`` where ``drop``: what ReLU normalizes
    (the forward pass's relu weights; the backward pass differentiates the same numbers).
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
