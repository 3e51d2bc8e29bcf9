"""Attention diagnostics (docs/concepts/diagnostics.md).

Pure numpy and standard library. The per-row statistics are computed in one
pass over the weights, in blocks of about ``rows.BLOCK_ELEMENTS`` elements copied
to float64, so the extra memory is a few blocks, never a full-size temporary.
All reductions run in float64; ``ln`` is evaluated in float32 for weights of at
most 32 bits (relative error ~1e-7, below what such weights carry) and in
float64 otherwise. Small inputs (``B * Hq * L * S + 16 * B * Hq * L <= 384``)
take a path in plain Python over lists instead (:func:`~.small.small_diagnostics`):
numpy's per-call overhead (~60 calls of ~1 us) dominates them. Both paths give
the same results but for the order of float sums (a few ulps).

Definitions (``A`` the weights of one query row, ``S`` the key count, ``n`` the
row's ``valid_keys``):

* *live* row: at least one finite non-zero weight. Otherwise the row is *fully
  masked*: masked out completely, or a relu row whose relu sum is 0.
* *informative* row: live and ``n >= 2``. Only informative rows can be
  collapsed, uniform or saturated (with one valid key the only distribution is
  one-hot, which says nothing about the model).
* Non-finite weights (NaN, +-inf) are counted in ``non_finite`` and read as 0
  by every other statistic, so every float in the result is finite.
* ``entropy`` ``H = -sum_j A_j ln A_j`` in nats, ``0 ln 0 = 0``, clipped below
  at 0 (weights rounded just above 1); 0 for fully masked rows.
* ``normalized_entropy`` ``H / ln n`` for informative rows, else 0.
* ``effective_support`` ``exp(H)`` for live rows, else 0.
* ``max_weight`` and ``argmax`` (first index of the max; -1 when fully masked).
* ``zeros``: valid keys whose weight is exactly 0, computed as
  ``#{j : A_j == 0} - (S - n)`` clipped to ``[0, n]``; masked keys are exactly 0
  by contract, so this is the sparsity of sparse normalizers (softmax: 0 unless
  exp underflows; a relu zero-sum row: ``n``; a masked-out row: 0).
* ``attention_distance`` ``sum_j A_j |p - j|`` with query position ``p = i``, or
  ``i + S - L`` when ``causal == "bottom_right"``.

Layout:

- ``thresholds``: :class:`DiagnosticThresholds`, the flags' and saturation's thresholds.
- ``rows``: the per-row kernel over float64 blocks, and the clamps to finite values.
- ``scores``: the score statistics (min, max, mean, std), merged over blocks.
- ``small``: the pure-Python twin of the numpy path for tiny inputs.
- ``report``: :func:`attention_diagnostics`, the per-row arrays, per-head summaries and health.
- ``probabilities``: :func:`probability_diagnostics` for /v1/softmax.
- ``inspection``: the per-head inspection (sink mass, spectral norm, head pattern scores, norm-based weights).
- ``spectral``: the per-head spectral norm of the logits, by power iteration to a stated tolerance (exact for
  small heads).
"""

from __future__ import annotations

from service.core.diagnostics.probabilities import probability_diagnostics
from service.core.diagnostics.report import attention_diagnostics
from service.core.diagnostics.thresholds import DiagnosticThresholds

__all__ = [
    "DiagnosticThresholds",
    "attention_diagnostics",
    "probability_diagnostics",
]
