"""Logits post-processing and sampling (semantics.md, "Logits post-processing"), in numpy only.

The steps, in this order, over the last axis of ``(N, V)`` logits:

1. masks (a boolean keep-mask selects, a float mask adds);
2. ``repetition_penalty`` r on each distinct previous token: ``z / r`` where ``z > 0``, ``z * r``
   otherwise (the CTRL rule, Keskar et al. 2019, as Hugging Face's ``RepetitionPenaltyLogitsProcessor``);
3. ``z - frequency_penalty * count - presence_penalty * [count > 0]`` (OpenAI's rule, as vLLM);
4. temperature ``z / T``; ``T = 0`` is greedy: one-hot on the argmax of step 3 (lowest id on ties);
5. ``top_k``: keep values ``>=`` the k-th largest, ties at the boundary kept (``TopKLogitsWarper``);
6. ``top_p``: in descending probability (lower id first on ties) keep a token while the mass before it is
   ``< top_p`` (``TopPLogitsWarper``; the softmax is over the tokens top_k kept);
7. ``min_p``: keep ``p >= min_p * max p`` (``MinPLogitsWarper``);
8. the final distribution is the softmax over the kept tokens; removed tokens are exactly 0.

Speed: a vocabulary of 256k and hundreds of rows must not be sorted in full. Steps 5-7 keep a prefix of
the tokens in descending order, so only a top set is sorted: the tokens at or above a per-row
threshold, gathered in one pass (ties at the threshold included, so the set is a prefix of the true
order). ``top_k``'s threshold is the k-th largest value, found by partial selection (``np.partition``),
``min_p``'s is ``max + log(min_p)``; ``top_p`` alone starts from the top 256 of each row and grows them
eightfold until every row's cut falls inside its set. Every step works on all rows at once.

Drawing: ``uniforms(seed, shape)`` takes 64-bit words from numpy's ``Philox`` (a counter-based generator,
Salmon et al. 2011, seeded through ``SeedSequence(seed)``; both streams are fixed by numpy) and maps each
to ``(word >> 11) * 2**-53`` in ``[0, 1)``, one per (row, draw) in C order. A draw is the inverse CDF of
the final distribution in token-id order: the smallest id whose cumulative probability (float64)
exceeds ``u`` times the row's total. The tokens depend only on the request and the seed: the same on
every run and engine; across CPUs only an ulp-level difference of ``exp`` could move a CDF boundary,
which changes a draw with probability about 1e-16 (float64) or 1e-7 (float32).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np

from service.core.errors import InvalidInput

INITIAL_TOP_P_CANDIDATES = 256
"""Candidates selected first when only ``top_p`` bounds the kept set; eight times more each round."""

MAX_TOP_LOGPROBS = 20

TokenLists = Sequence[int] | Sequence[Sequence[int]] | np.ndarray


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """The options of steps 2-7; the defaults leave the softmax unchanged."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0


def check_params(params: SamplingParams) -> None:
    """Reject options outside their ranges (api.md), naming the field."""
    checks = (
        ("temperature", math.isfinite(params.temperature) and params.temperature >= 0, "must be a finite number >= 0"),
        ("top_k", params.top_k >= 0, "must be an integer >= 0 (0 = off)"),
        ("top_p", 0 < params.top_p <= 1, "must be in (0, 1]"),
        ("min_p", 0 <= params.min_p < 1, "must be in [0, 1)"),
        (
            "repetition_penalty",
            math.isfinite(params.repetition_penalty) and params.repetition_penalty > 0,
            "must be a finite number > 0",
        ),
        ("presence_penalty", math.isfinite(params.presence_penalty), "must be a finite number"),
        ("frequency_penalty", math.isfinite(params.frequency_penalty), "must be a finite number"),
    )
    for name, ok, msg in checks:
        if not ok:
            raise InvalidInput(f"{name} {msg}", (name,))


# --------------------------------------------------------------------------- steps 1-3


def previous_token_pairs(previous_tokens: TokenLists, rows: int, vocab: int) -> tuple[np.ndarray, np.ndarray]:
    """(row, token) index pairs of ``previous_tokens``: one list for every row, or one list per row.

    An integer array of rank 2 (the /v2 form) is one list per row, where ``-1`` entries are padding.
    Ids outside ``[0, vocab)`` are an :class:`InvalidInput` naming the element.
    """
    position: np.ndarray  # (T, k): each token's index in the request, for error messages
    if isinstance(previous_tokens, np.ndarray):
        arr = previous_tokens
        if arr.dtype.kind not in "iu" or arr.ndim not in (1, 2):
            raise InvalidInput("previous_tokens must be integers, one list or one list per row", ("previous_tokens",))
        per_row = arr.ndim == 2
        if per_row:
            if arr.shape[0] != rows:
                raise InvalidInput(
                    f"previous_tokens has {arr.shape[0]} rows but the logits have {rows}", ("previous_tokens",)
                )
            r, c = np.nonzero(arr != -1)
            toks = arr[r, c].astype(np.int64)
            row_ids = r.astype(np.int64)
            position = np.stack([r, c], axis=1)
        else:
            toks = arr.astype(np.int64)
            row_ids = np.zeros(0, np.int64)
            position = np.arange(toks.size)[:, None]
    else:
        items = list(previous_tokens)
        per_row = bool(items) and isinstance(items[0], list | tuple | np.ndarray)
        if per_row:
            for i, x in enumerate(items):
                if not isinstance(x, list | tuple | np.ndarray):
                    raise InvalidInput(
                        f"previous_tokens[{i}] must be a list of token ids: give one list per row, or one flat list",
                        ("previous_tokens", i),
                    )
                _check_ids(x, vocab, (i,))
            if len(items) != rows:
                raise InvalidInput(
                    f"previous_tokens has {len(items)} lists but the logits have {rows} rows", ("previous_tokens",)
                )
            lists = cast(list[Sequence[int]], items)
            lengths = np.array([len(x) for x in lists], dtype=np.int64)
            toks = np.fromiter((t for x in lists for t in x), dtype=np.int64, count=int(lengths.sum()))
            row_ids = np.repeat(np.arange(rows, dtype=np.int64), lengths)
        else:
            _check_ids(items, vocab, ())
            toks = np.asarray(items, dtype=np.int64).reshape(-1)
            row_ids = np.zeros(0, np.int64)
        position = np.zeros((0, 1), dtype=np.int64)  # every id was checked above
    bad = np.nonzero((toks < 0) | (toks >= vocab))[0]
    if bad.size:
        i = int(bad[0])
        where = [int(v) for v in position[i]]
        raise InvalidInput(
            f"previous_tokens{where} = {int(toks[i])} is not a token id in [0, {vocab})",
            ("previous_tokens", *where),
        )
    if not per_row:  # one list for every row
        row_ids = np.repeat(np.arange(rows, dtype=np.int64), toks.size)
        toks = np.tile(toks, rows)
    return row_ids, toks


def _check_ids(ids: Sequence[object] | np.ndarray, vocab: int, where: tuple[int, ...]) -> None:
    """Each element an integer token id in [0, vocab), or an :class:`InvalidInput` naming the first that is not."""
    for j, t in enumerate(ids):
        if isinstance(t, bool) or not isinstance(t, int | np.integer) or not 0 <= t < vocab:
            loc = (*where, j)
            what = "an integer" if isinstance(t, bool) or not isinstance(t, int | np.integer) else "a token id"
            raise InvalidInput(
                f"previous_tokens{list(loc)} = {t!r} is not {what} in [0, {vocab})", ("previous_tokens", *loc)
            )


def apply_penalties(z: np.ndarray, row_ids: np.ndarray, tokens: np.ndarray, params: SamplingParams) -> bool:
    """Steps 2 and 3, in place on ``z`` (N, V): the repetition penalty once per distinct token, then
    the frequency and presence penalties (OpenAI's rule: ``- f * count - p * [count > 0]``).
    Returns whether any logit changed.
    """
    if tokens.size == 0:
        return False
    if params.repetition_penalty == 1 and params.frequency_penalty == 0 and params.presence_penalty == 0:
        return False
    vocab = z.shape[1]
    keys, counts = np.unique(row_ids * vocab + tokens, return_counts=True)
    r, c = np.divmod(keys, vocab)
    vals = z[r, c].astype(np.float64)
    rep = params.repetition_penalty
    if rep != 1:
        with np.errstate(over="ignore"):
            vals = np.where(vals > 0, vals / rep, vals * rep)
    with np.errstate(over="ignore", invalid="ignore"):  # huge penalties: checked just below
        vals = vals - params.frequency_penalty * counts - params.presence_penalty
        out = vals.astype(z.dtype)
    if np.isposinf(out).any() or np.isnan(out).any():
        raise InvalidInput(f"the penalties make a logit overflow {z.dtype.name}", ("frequency_penalty",))
    z[r, c] = out
    return True


def apply_mask(z: np.ndarray, mask: np.ndarray | None) -> None:
    """Step 1 in place: a boolean mask (True = keep) sets removed tokens to -inf, a float mask is added."""
    if mask is None:
        return
    try:
        if np.broadcast_shapes(mask.shape, z.shape) != z.shape:
            raise ValueError
    except ValueError:
        raise InvalidInput(
            f"mask shape {tuple(mask.shape)} does not broadcast to the logits shape {tuple(z.shape)}",
            ("mask", "shape"),
        ) from None
    if mask.dtype == bool:
        np.copyto(z, -np.inf, where=~mask)
    else:
        if np.isnan(mask).any() or np.isposinf(mask).any():
            raise InvalidInput("a float mask may hold finite numbers or -inf, not NaN or +inf", ("mask",))
        with np.errstate(over="ignore"):
            z += mask.astype(z.dtype, copy=False)
        if np.isposinf(z).any():
            raise InvalidInput(f"logits + mask overflow {z.dtype.name}", ("mask",))


# --------------------------------------------------------------------------- steps 4-8


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


def _logsumexp(x: np.ndarray, where: np.ndarray | None = None) -> np.ndarray:
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
            lse_all if lse_all is not None else _logsumexp(y),
            vocab,
            ordered=False,
        )

    if k:  # top_p's softmax is over the top-k set, which is all there is to sort
        ids, vals = top_set(y, k)
        valid = ids >= 0
        lse_ref = _logsumexp(vals, valid)
        keep = _top_p_keep(vals, valid, lse_ref, params.top_p) & (vals >= log_min_p)
        return _finish(ids, vals, keep, lse_all, vocab, ordered=True)

    if lse_all is None:
        lse_all = _logsumexp(y)
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


# --------------------------------------------------------------------------- drawing


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


# --------------------------------------------------------------------------- the whole pipeline


@dataclass(slots=True)
class RawStats:
    """Log-sum-exp and entropy of ``softmax(logits)`` as given, per row."""

    max: np.ndarray
    lse: np.ndarray
    entropy: np.ndarray


def raw_stats(logits: np.ndarray) -> RawStats:
    """Per-row max, log-sum-exp (of ``logits - max``) and softmax entropy (nats) of finite (N, V) logits."""
    m = np.max(logits, axis=-1, keepdims=True)
    with np.errstate(over="ignore"):
        x = logits - m  # may overflow to -inf across the whole float range ...
    np.maximum(x, np.finfo(x.dtype).min, out=x)  # ... and 0 * -inf would be NaN in the entropy
    with np.errstate(under="ignore"):
        e = np.exp(x)
    s = np.sum(e, axis=-1, dtype=np.float64)
    ex = np.einsum("ij,ij->i", e, x, dtype=np.float64)  # sum of e * x without a temporary
    lse = np.log(s)
    return RawStats(m[:, 0].astype(np.float64), lse, np.maximum(lse - ex / s, 0.0))


@dataclass(slots=True)
class SampleResult:
    """Everything /v1/sample can return; fields not asked for are None."""

    filtered: Filtered
    tokens: np.ndarray | None
    logprobs: np.ndarray | None
    raw_logprobs: np.ndarray | None
    entropy_raw: np.ndarray | None


def process(
    logits: np.ndarray,
    params: SamplingParams,
    *,
    mask: np.ndarray | None = None,
    previous_tokens: TokenLists | None = None,
    dtype: np.dtype | type | None = None,
    removed_mass: bool = True,
    raw: RawStats | None = None,
) -> tuple[Filtered, np.ndarray]:
    """Steps 1-8 on finite logits (V,) or (N, V): the final distribution and step 3's values (N, V).

    ``removed_mass=False`` skips the pass that diagnostic needs; ``raw`` (:func:`raw_stats` of the same
    logits) saves it when steps 1-4 leave the logits as they are. Raises :class:`InvalidInput` for bad
    options, a mask that does not broadcast, token ids out of range, and rows with no token left after
    the mask (nothing to sample).
    """
    check_params(params)
    if logits.ndim not in (1, 2):
        raise InvalidInput(f"logits must have rank 1 (V,) or 2 (N, V), got rank {logits.ndim}", ("logits",))
    dtype = np.dtype(dtype or (logits.dtype if logits.dtype.kind == "f" else np.float64))
    z = np.array(np.atleast_2d(logits), dtype=dtype, copy=True)
    n_rows, vocab = z.shape
    if mask is not None:
        if mask.ndim > 2:
            raise InvalidInput(f"mask has rank {mask.ndim}; the logits have rank {logits.ndim}", ("mask", "shape"))
        apply_mask(z, mask)
    penalized = False
    if previous_tokens is not None:
        r, t = previous_token_pairs(previous_tokens, n_rows, vocab)
        penalized = apply_penalties(z, r, t, params)
    zmax = np.max(z, axis=-1, keepdims=True)
    dead = np.nonzero(zmax[:, 0] == -np.inf)[0]
    if dead.size:
        loc: tuple[str | int, ...] = ("mask",) if logits.ndim == 1 else ("mask", int(dead[0]))
        raise InvalidInput(f"the mask removes every token of row {int(dead[0])}: there is nothing to sample", loc)
    if params.temperature == 0:
        return greedy(z), z
    # Shifting by the row max first keeps z / T finite for any T > 0 (softmax is shift-invariant).
    with np.errstate(over="ignore"):
        y = z - zmax
    if params.temperature != 1:
        # A temperature below the dtype's smallest subnormal number would round to 0 (and 0 / 0 is NaN).
        # A huge one would cast to inf: the largest finite one gives the same uniform answer.
        info = np.finfo(dtype)
        t = dtype.type(min(max(params.temperature, float(info.smallest_subnormal)), float(info.max)))
        with np.errstate(under="ignore", over="ignore"):
            y /= t
    unchanged = mask is None and not penalized and params.temperature == 1
    if raw is not None and unchanged:  # y is the logits minus their max: the raw log-sum-exp is y's
        lse_all: np.ndarray | None = raw.lse
    else:
        lse_all = _logsumexp(y) if removed_mass else None
    return filter_logits(y, params, lse_all=lse_all), z
