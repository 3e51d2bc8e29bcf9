"""Drawing tokens from the final distribution: seeded uniforms, the inverse CDF, and the top log-probabilities."""

from __future__ import annotations

import math

import numpy as np

from service.core.sampling.filters import Filtered, top_set


def uniforms(seed: int, shape: tuple[int, ...]) -> np.ndarray:
    """Uniform float64 numbers in [0, 1) from ``Philox(seed)``: ``(word >> 11) * 2**-53``, in C order."""
    count = math.prod(shape)
    words = np.random.Philox(seed).random_raw(count)
    return ((np.asarray(words, dtype=np.uint64) >> np.uint64(11)).astype(np.float64) * 2.0**-53).reshape(shape)


def _search_rows(cdf: np.ndarray, target: np.ndarray) -> np.ndarray:
    """For each row i and column j: the first index with ``cdf[i, idx] > target[i, j]`` (K when none)."""
    n_rows, width = cdf.shape
    lo = np.zeros(target.shape, dtype=np.int64)
    hi = np.full(target.shape, width, dtype=np.int64)
    rows = np.arange(n_rows)[:, None]
    for _ in range(max(1, width).bit_length() + 1):
        active = lo < hi
        if not active.any():
            break
        mid = (lo + hi) // 2
        right = active & (cdf[rows, np.minimum(mid, width - 1)] <= target)
        lo = np.where(right, mid + 1, lo)
        hi = np.where(active & ~right, mid, hi)
    return lo


def draw(filtered: Filtered, u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Tokens (N, n) and their final log-probabilities: the inverse CDF, in token-id order, at ``u`` (N, n)."""
    ids, probs, logp = filtered.ids, filtered.probs, filtered.logprobs
    if filtered.ordered and ids.shape[1] > 1:
        order = np.argsort(ids, axis=-1, kind="stable")
        ids = np.take_along_axis(ids, order, axis=-1)
        probs = np.take_along_axis(probs, order, axis=-1)
        logp = np.take_along_axis(logp, order, axis=-1)
    cdf = np.cumsum(probs, axis=-1, dtype=np.float64)
    target = u * cdf[:, -1:]
    pos = _search_rows(cdf, target)
    width = ids.shape[1]
    last_positive = width - 1 - np.argmax(probs[:, ::-1] > 0, axis=-1)
    pos = np.minimum(pos, last_positive[:, None])
    rows = np.arange(ids.shape[0])[:, None]
    return ids[rows, pos], logp[rows, pos]


def top_logprobs(filtered: Filtered, m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The m most probable tokens of each row's final distribution (descending, lower id first on ties):
    (ids, logprobs, valid) of shape (N, m); ``valid`` is False past a row's kept tokens.
    """
    if filtered.ordered:
        ids, logp, probs = filtered.ids[:, :m], filtered.logprobs[:, :m], filtered.probs[:, :m]
    else:
        ids, logp = top_set(filtered.logprobs, min(m, filtered.ids.shape[1]))
        ids, logp = ids[:, :m], logp[:, :m]
        probs = np.take_along_axis(filtered.probs, ids, axis=-1)
    return ids, logp, (probs > 0) & (ids >= 0)
