"""Logits post-processing and sampling (docs/concepts/contract.md, "Logits post-processing"), in numpy only.

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

Layout:

- ``params``: :class:`SamplingParams` (the options of steps 2-7) and their ranges.
- ``penalties``: steps 1-3, the masks and the repetition, frequency and presence penalties.
- ``filters``: steps 4-8, greedy, ``top_k``, ``top_p``, ``min_p`` and the final distribution (:class:`Filtered`).
- ``draws``: seeded uniforms, the inverse-CDF draw and the top log-probabilities.
- ``pipeline``: :func:`process`, steps 1-8 on a logits array, and :func:`raw_stats`.
"""

from __future__ import annotations

from service.core.sampling.draws import draw, top_logprobs, uniforms
from service.core.sampling.filters import (
    INITIAL_TOP_P_CANDIDATES,
    Filtered,
    filter_logits,
    greedy,
    threshold_set,
    top_set,
)
from service.core.sampling.params import MAX_TOP_LOGPROBS, SamplingParams, TokenLists, check_params
from service.core.sampling.penalties import apply_mask, apply_penalties, previous_token_pairs
from service.core.sampling.pipeline import RawStats, SampleResult, process, raw_stats

__all__ = [
    "INITIAL_TOP_P_CANDIDATES",
    "MAX_TOP_LOGPROBS",
    "Filtered",
    "RawStats",
    "SampleResult",
    "SamplingParams",
    "TokenLists",
    "apply_mask",
    "apply_penalties",
    "check_params",
    "draw",
    "filter_logits",
    "greedy",
    "previous_token_pairs",
    "process",
    "raw_stats",
    "threshold_set",
    "top_logprobs",
    "top_set",
    "uniforms",
]
