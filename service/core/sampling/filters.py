"""Steps 4-8: greedy decoding, ``top_k``, ``top_p``, ``min_p`` and the final distribution over the kept tokens.

Steps 5-7 keep a prefix of the tokens in descending order, so only a top set is sorted: the tokens at
or above a per-row threshold, gathered in one pass (ties at the threshold included).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from service.core.sampling.params import SamplingParams

INITIAL_TOP_P_CANDIDATES = 256
"""Candidates selected first when only ``top_p`` bounds the kept set; eight times more each round."""


@dataclass(slots=True)
class Filtered:
    """The final distribution in sparse form, one row per logits row.

    ``ids`` (N, K) are the candidate tokens of each row and ``probs``/``logprobs`` their final
    probabilities (0 and -inf for candidates that were removed); every token outside ``ids`` has
    probability 0. ``ordered`` says the candidates are in descending probability (lower id first on
    ties); without filters the candidates are the whole vocabulary in id order.
    """

    ids: np.ndarray
    probs: np.ndarray
    logprobs: np.ndarray
    ordered: bool
    kept: np.ndarray
    entropy: np.ndarray
    removed_mass: np.ndarray
    vocab: int

    def dense(self, dtype: np.dtype | type) -> np.ndarray:
        """The final distribution with the logits' shape (N, V)."""
        out = np.zeros((self.ids.shape[0], self.vocab), dtype=dtype)
        if self.ids.shape[1] == self.vocab and not self.ordered:
            out[:] = self.probs
        else:
            rows, cols = np.nonzero(self.ids >= 0)  # padding (id -1) has no place in the vocabulary
            out[rows, self.ids[rows, cols]] = self.probs[rows, cols]
        return out


def logsumexp(x: np.ndarray, where: np.ndarray | None = None) -> np.ndarray:
    """Row-wise log-sum-exp (float64) of values whose row max is at most 0 and at least one is finite."""
    with np.errstate(under="ignore"):
        e = np.exp(x)
        if where is not None:
            e = np.where(where, e, 0)
        s = np.sum(e, axis=-1, dtype=np.float64)
    m = np.max(x, axis=-1, where=where if where is not None else True, initial=-np.inf).astype(np.float64)
    with np.errstate(divide="ignore"):
        out = np.log(s)
    # exp(x) underflows to 0 only when the row max is far below 0; recompute those rows shifted.
    tiny = s == 0
    if tiny.any():
        shifted = x[tiny] - m[tiny, None]
        w = None if where is None else where[tiny]
        with np.errstate(under="ignore"):
            e2 = np.exp(shifted)
            if w is not None:
                e2 = np.where(w, e2, 0)
        out[tiny] = m[tiny] + np.log(np.sum(e2, axis=-1, dtype=np.float64))
    return out


def threshold_set(y: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The tokens where ``mask`` holds, per row, sorted by descending value (lower id first on ties).

    Returns (ids, values) of shape (N, K) with K the largest count of a row; shorter rows are padded
    with id -1 and value -inf, which every later step treats as removed.
    """
    n_rows = y.shape[0]
    rows, cols = np.nonzero(mask)  # row-major: each row's ids ascending
    counts = np.bincount(rows, minlength=n_rows)
    width = max(int(counts.max()), 1)
    if int(counts.min()) == width:
        ids = cols.reshape(n_rows, width).astype(np.int64, copy=False)
        vals = np.take_along_axis(y, ids, axis=-1)
    else:
        ids = np.full((n_rows, width), -1, dtype=np.int64)
        vals = np.full((n_rows, width), -np.inf, dtype=y.dtype)
        starts = np.cumsum(counts) - counts
        pos = np.arange(cols.size) - starts[rows]
        ids[rows, pos] = cols
        vals[rows, pos] = y[rows, cols]
    order = np.lexsort((ids, -vals), axis=-1)
    return np.take_along_axis(ids, order, axis=-1), np.take_along_axis(vals, order, axis=-1)


def top_set(y: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Every token whose value is >= its row's k-th largest (ties at the boundary included), sorted as
    :func:`threshold_set`. The k-th largest comes from ``np.partition`` (introselect, SIMD for float32
    and float64), not a sort; ``top_k`` needs no more.
    """
    vocab = y.shape[1]
    if k >= vocab:
        return threshold_set(y, np.ones(y.shape, dtype=bool))
    kth = np.partition(y, vocab - k, axis=-1)[:, vocab - k]
    return threshold_set(y, y >= kth[:, None])


def _finish(
    ids: np.ndarray, vals: np.ndarray, keep: np.ndarray, lse_all: np.ndarray | None, vocab: int, ordered: bool
) -> Filtered:
    """Step 8 on the candidates: the softmax over the kept ones, and the per-row diagnostics.

    The row max (0) is always kept, so ``exp(vals) / sum`` neither overflows nor loses the row; it is
    more accurate than ``exp(vals - lse)`` in float32.
    """
    keep = keep & (vals > -np.inf)
    with np.errstate(under="ignore"):
        e = np.where(keep, np.exp(vals), 0)
    total: np.ndarray = e.sum(axis=-1, dtype=np.float64)
    lse_kept = np.log(total)
    with np.errstate(under="ignore", invalid="ignore"):
        probs = (e / total[:, None]).astype(vals.dtype)
        logp = np.where(keep, vals - lse_kept[:, None].astype(vals.dtype), -np.inf)
    positive = probs > 0
    kept = np.count_nonzero(positive, axis=-1)
    plogp = probs.astype(np.float64) * np.where(positive, logp, 0.0)
    entropy = np.maximum(-np.sum(plogp, axis=-1), 0.0)
    if lse_all is None:
        removed = np.zeros(ids.shape[0])
    else:
        removed = np.clip(-np.expm1(np.minimum(lse_kept - lse_all, 0.0)), 0.0, 1.0)
    return Filtered(ids, probs, logp, ordered, kept, entropy, removed, vocab)


def filter_logits(y: np.ndarray, params: SamplingParams, *, lse_all: np.ndarray | None = None) -> Filtered:
    """Steps 5-8 on ``y`` (N, V), step 4's values shifted so that each row's max is 0.

    ``lse_all`` (the row log-sum-exp of ``y``) is computed when ``top_p`` needs it and not given; it is
    also what ``removed_mass`` is measured against (0 reported when it is neither given nor needed).
    """
    vocab = y.shape[1]
    k = params.top_k if 0 < params.top_k < vocab else 0
    log_min_p = np.asarray(math.log(params.min_p) if params.min_p > 0 else -math.inf).astype(y.dtype)

    if params.top_p >= 1:
        if k:
            ids, vals = top_set(y, k)
            return _finish(ids, vals, (ids >= 0) & (vals >= log_min_p), lse_all, vocab, ordered=True)
        if params.min_p > 0:  # p >= min_p * max p  <=>  y >= log(min_p), the row max being 0
            ids, vals = threshold_set(y, y >= log_min_p)
            return _finish(ids, vals, ids >= 0, lse_all, vocab, ordered=True)
        # Nothing to filter: the softmax itself, over the whole vocabulary in id order.
        ids = np.broadcast_to(np.arange(vocab, dtype=np.int64), y.shape)
        return _finish(
            ids,
            y,
            np.ones(y.shape, dtype=bool),
            lse_all if lse_all is not None else logsumexp(y),
            vocab,
            ordered=False,
        )

    if k:  # top_p's softmax is over the top-k set, which is all there is to sort
        ids, vals = top_set(y, k)
        valid = ids >= 0
        lse_ref = logsumexp(vals, valid)
        keep = _top_p_keep(vals, valid, lse_ref, params.top_p) & (vals >= log_min_p)
        return _finish(ids, vals, keep, lse_all, vocab, ordered=True)

    if lse_all is None:
        lse_all = logsumexp(y)
    kk = min(vocab, INITIAL_TOP_P_CANDIDATES)
    while True:
        # A top set is a prefix of each row's order (ties included), so the decisions inside it are final;
        # the cut is found once some candidate of every row is removed, or the set is the whole row.
        ids, vals = top_set(y, kk)
        valid = ids >= 0
        keep = _top_p_keep(vals, valid, lse_all, params.top_p) & (vals >= log_min_p)
        n_cand = np.count_nonzero(valid, axis=-1)
        if kk >= vocab or bool(np.all(np.count_nonzero(keep, axis=-1) < n_cand)):
            return _finish(ids, vals, keep, lse_all, vocab, ordered=True)
        kk = min(vocab, kk * 8)


def _top_p_keep(vals: np.ndarray, valid: np.ndarray, lse_ref: np.ndarray, top_p: float) -> np.ndarray:
    """Sorted candidates whose preceding mass (float64) under ``exp(vals - lse_ref)`` is below ``top_p``."""
    with np.errstate(under="ignore"):
        p = np.where(valid, np.exp(vals.astype(np.float64) - lse_ref[:, None]), 0.0)
    before = np.cumsum(p, axis=-1) - p
    keep = valid & (before < top_p)
    keep[:, 0] = True  # top_p > 0: the most probable token always stays
    return keep


def greedy(z: np.ndarray) -> Filtered:
    """``T = 0``: one-hot on each row's argmax of step 3's values, lowest id on ties (``np.argmax``)."""
    n_rows, vocab = z.shape
    ids = np.argmax(z, axis=-1).astype(np.int64)[:, None]
    ones = np.ones((n_rows, 1), dtype=z.dtype)
    zero = np.zeros(n_rows)
    return Filtered(ids, ones, np.zeros_like(ones), True, np.ones(n_rows, dtype=np.int64), zero, zero.copy(), vocab)
