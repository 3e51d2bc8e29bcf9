"""Pydantic models of ``/v1/attention/backward`` and ``/v1/attention/analyze``.

Their field names are fixed: docs/concepts/fixed-names.md.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt

from service.dataplane.options import Alpha, Causal, NormalizerName, PositiveFloat, causal_alignment
from service.http.v1.schemas import (
    AttentionFields,
    EngineInfo,
    GradientHealthReport,
    KeyLength,
    OutTensor,
    TensorField,
)

BackwardReturnName = Literal[
    "grad_query",
    "grad_key",
    "grad_value",
    "grad_mask",
    "grad_scale",
    "grad_temperature",
    "output",
    "weights",
    "gradient_health",
    "head_importance",
]

DEFAULT_BACKWARD_RETURNS: tuple[BackwardReturnName, ...] = ("grad_query", "grad_key", "grad_value")

# A sweep has at most this many values per axis (scales, temperatures, head dims).
MAX_SWEEP_VALUES = 16


class AttentionBackwardRequest(AttentionFields):
    """Body of ``POST /v1/attention/backward``: a /v1/attention request plus the upstream gradients."""

    grad_output: TensorField = Field(
        description="Gradient of the loss with respect to the output: the output's shape, query.shape[:-1] + (Ev,)."
    )
    grad_weights: TensorField | None = Field(
        None,
        description="Optional gradient with respect to the weights (query.shape[:-1] + (S,)), added to the one "
        "that flows back from the output.",
    )
    # The backward request returns other names than /v1/attention: pydantic lets a subclass redefine a field,
    # mypy sees an incompatible override of the base class attribute.
    return_: list[BackwardReturnName] = Field(  # type: ignore[assignment]
        default_factory=lambda: list(DEFAULT_BACKWARD_RETURNS),
        alias="return",
        max_length=10,
        description="What to return; grad_mask needs a float mask.",
    )


class AttentionBackwardResponse(BaseModel):
    """Body of a successful ``POST /v1/attention/backward``; each field present when asked for."""

    grad_query: OutTensor | None = None
    grad_key: OutTensor | None = None
    grad_value: OutTensor | None = None
    grad_mask: OutTensor | None = None
    grad_scale: float | None = None
    grad_temperature: float | None = None
    output: OutTensor | None = None
    weights: OutTensor | None = None
    gradient_health: GradientHealthReport | None = None
    head_importance: OutTensor | None = Field(
        None,
        description="(B, H): |sum over rows and features of grad_output * output| per batch entry and query head "
        "(Michel et al. 2019, per example and unnormalised).",
    )
    engine: EngineInfo
    timing_ms: dict[str, float]


class AnalyzeRequest(BaseModel):
    """Body of ``POST /v1/attention/analyze``: query and key given, or drawn from ``shape``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    query: TensorField | None = Field(None, description="(B, H, L, E), (H, L, E) or (L, E); with key.")
    key: TensorField | None = Field(None, description="(B, Hkv, S, E), the query's rank; with query.")
    shape: Annotated[list[Annotated[StrictInt, Field(ge=1)]], Field(min_length=4, max_length=4)] | None = Field(
        None, description="[B, H, L, E]: draw query and key (S = L) instead of sending them."
    )
    distribution: Literal["normal"] = Field("normal", description="Distribution of drawn entries: standard normal.")
    seed: Annotated[StrictInt, Field(ge=0, le=2**63 - 1)] = Field(0, description="Seed of the draw.")
    scales: Annotated[list[PositiveFloat], Field(min_length=1, max_length=MAX_SWEEP_VALUES)] | None = Field(
        None, description="Scales to sweep; default [1, 1/sqrt(E)] (for each E)."
    )
    temperatures: Annotated[list[PositiveFloat], Field(min_length=1, max_length=MAX_SWEEP_VALUES)] = Field(
        default_factory=lambda: [0.5, 1.0, 2.0], description="Temperatures to sweep."
    )
    head_dims: (
        Annotated[list[Annotated[StrictInt, Field(ge=1)]], Field(min_length=1, max_length=MAX_SWEEP_VALUES)] | None
    ) = Field(None, description="E values to sweep when drawing (replaces shape's E).")
    normalizer: NormalizerName = "softmax"
    alpha: Alpha | None = Field(None, description="For 'entmax'.")
    mask: TensorField | None = Field(None, description="As in /v1/attention, broadcastable to (B, H, L, S).")
    causal: StrictBool | Literal["top_left", "bottom_right"] = False
    key_lengths: list[KeyLength] | None = None
    vanishing_threshold: Annotated[float, Field(strict=True, ge=0, allow_inf_nan=False)] = Field(
        1e-3, description="A row's gradient vanishes when its Jacobian norm is below this."
    )

    @property
    def causal_alignment(self) -> Causal | None:
        return causal_alignment(self.causal)


class SweepRow(BaseModel):
    """One (head_dim, scale, temperature) of the sweep; means over rows with at least two valid keys."""

    scale: float
    temperature: float
    head_dim: int
    score_std: float = Field(description="Std of the normalizer input (scale QK^T + bias)/T over unmasked positions.")
    score_range: float = Field(description="Mean over rows of (largest - smallest unmasked score).")
    mean_entropy: float
    mean_normalized_entropy: float
    saturated_fraction: float = Field(description="Rows whose largest weight exceeds 1 - saturation margin.")
    mean_jacobian_norm: float
    vanishing_fraction: float
    rows: int


class AnalyzeResponse(BaseModel):
    """Body of a successful ``POST /v1/attention/analyze``."""

    model_config = ConfigDict(extra="allow")

    sweep: list[SweepRow]
    normalizer: str
    shape: list[int] = Field(description="[B, H, L, S] of the scores.")
    seed: int | None = Field(None, description="The seed of the draw (null when query and key were sent).")
    vanishing_threshold: float
    saturation_margin: float
    timing_ms: dict[str, float]
