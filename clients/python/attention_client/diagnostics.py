"""The diagnostics in the service's answers, as ``TypedDict``s: plain dicts at run time, as the service sends
them (docs/concepts/diagnostics.md); a type checker knows their keys. :mod:`attention_client.results` holds the
results that carry them (and re-exports these names).
"""

from __future__ import annotations

from typing import NotRequired, TypeAlias, TypedDict

__all__ = [
    "AttentionDiagnostics",
    "GradientHealth",
    "HeadDiagnostics",
    "HeadGradientHealth",
    "HeadInspection",
    "InspectionReport",
    "RowValues",
    "SampleDiagnostics",
    "ScoreStats",
    "SessionDiagnostics",
    "SoftmaxDiagnostics",
]

RowValues: TypeAlias = "float | list[RowValues]"
"""One number per row, as JSON: nested lists with the input's shape without its last axis (a bare number
when the input was one row). ``np.asarray(values)`` makes an array of it."""


class HeadDiagnostics(TypedDict):
    """Per (batch, query head) of ``/v1/attention``'s ``diagnostics``."""

    batch: int
    head: int
    mean_entropy: float
    mean_normalized_entropy: float
    mean_distance: float
    collapsed: bool
    uniform: bool
    live_rows: int
    informative_rows: int
    collapsed_fraction: float


class ScoreStats(TypedDict):
    """Statistics of the scores over unmasked positions."""

    min: float
    max: float
    mean: float
    std: float
    count: int


class AttentionDiagnostics(TypedDict):
    """``/v1/attention``'s ``diagnostics``: per-row values (the query's shape without its last axis),
    per-head summaries, and counts over the whole request.
    """

    entropy: RowValues
    normalized_entropy: RowValues
    max_weight: RowValues
    argmax: RowValues
    effective_support: RowValues
    zeros: RowValues
    attention_distance: RowValues
    heads: list[HeadDiagnostics]
    fully_masked_rows: int
    row_sum_max_error: float
    non_finite: int
    saturated_rows: int
    score_stats: ScoreStats | None


class SessionDiagnostics(AttentionDiagnostics):
    """A session step's ``diagnostics``: attention's, over each row of kept positions, and ``sink_mass``."""

    sink_mass: RowValues
    """Each row's weight on the sequence's positions 0 to ``sink_positions - 1`` (those the cache still keeps)."""


class SoftmaxDiagnostics(TypedDict):
    """``/v1/softmax``'s ``diagnostics``: per row (a number for a single row), and counts."""

    entropy: RowValues
    max: RowValues
    argmax: RowValues
    fully_masked_rows: NotRequired[int]
    non_finite: NotRequired[int]
    row_sum_max_error: NotRequired[float]


class SampleDiagnostics(TypedDict):
    """``/v1/sample``'s ``diagnostics``: per row of logits (a number for a single row)."""

    entropy_raw: RowValues
    """Entropy (nats) of softmax(logits) as given."""
    entropy: RowValues
    """Entropy (nats) of the final distribution."""
    kept: RowValues
    """Tokens with nonzero final probability."""
    removed_mass: RowValues
    """Probability mass the filters removed."""


class HeadGradientHealth(TypedDict):
    """Per (batch, query head), over its rows with at least two valid keys."""

    batch: int
    head: int
    mean_jacobian_norm: float
    vanishing_fraction: float
    rows: int


class GradientHealth(TypedDict):
    """How much gradient the normalizer lets through, per head (``gradient_health``)."""

    threshold: float
    heads: list[HeadGradientHealth]


class HeadInspection(TypedDict):
    """Per (batch, query head) of ``/v1/attention``'s ``inspection`` (docs/concepts/diagnostics.md, "Inspection")."""

    batch: int
    head: int
    sink_mass: float
    """Mean over the head's live rows of the weight on keys 0 to ``sink_positions - 1`` (attention sinks)."""
    spectral_norm: float
    """Largest singular value of ``Q K^T * scale / temperature`` before masks (the entropy-collapse bound)."""
    live_rows: int
    """Rows with at least one valid key (those ``sink_mass`` averages over)."""
    norm_max_share: float
    """Mean over rows of the largest ``||A_ij v_j||`` over the row's sum (Kobayashi et al. 2020)."""
    norm_argmax_agreement: float
    """Share of rows whose largest ``||A_ij v_j||`` is at the largest weight ``A_ij``."""
    previous_token_score: NotRequired[float]
    """With ``token_ids``: TransformerLens' previous-token score ("mul" measure)."""
    duplicate_token_score: NotRequired[float]
    """With ``token_ids``: TransformerLens' duplicate-token score."""
    induction_score: NotRequired[float]
    """With ``token_ids``: TransformerLens' induction score."""


class InspectionReport(TypedDict):
    """``/v1/attention``'s ``inspection``: sinks, the entropy-collapse bound, head patterns, norm-based weights."""

    sink_positions: int
    heads: list[HeadInspection]
