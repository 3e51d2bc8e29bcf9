"""Pydantic models of ``POST /v1/attention/rollout`` (names fixed by docs/concepts/fixed-names.md)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt

from service.dataplane.rollout import Fraction, HeadFusion
from service.http.v1.schemas import OutTensor, TensorField


class RolloutRequest(BaseModel):
    """Body of ``POST /v1/attention/rollout`` (docs/concepts/diagnostics.md, "Rollout")."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    weights: TensorField = Field(
        description="[layers, B, H, L, L]: each layer's attention weights, first layer first; each row sums to 1, or "
        "to 0 (a fully masked query). float16, float32 or float64."
    )
    gradients: TensorField | None = Field(
        None,
        description="The weights' shape: the gradient of a loss with respect to each weight. The gradient-weighted "
        "form: each layer fused as the mean over heads of relu(grad * A) (Chefer et al. 2021).",
    )
    head_fusion: HeadFusion = Field(
        "mean", description="How each layer's heads are fused: mean, max or min (with gradients, mean only)."
    )
    residual: Fraction = Field(
        0.5, description="A_hat = residual * I + (1 - residual) * A_fused, then each row divided by its sum."
    )
    discard_ratio: Fraction = Field(
        0.0,
        description="The lowest int(L * L * discard_ratio) entries of each fused matrix set to 0 before the residual, "
        "never [0, 0] (vit-explain's rule), in every batch entry.",
    )
    rows: Annotated[list[StrictInt], Field(min_length=1)] | None = Field(
        None,
        description="Only these rows of the answer ([B, R, L]), computed from the left: e.g. [0] (the first "
        "token's row) or [-1] (the last); negative from the end, none twice.",
    )
    top_k: Annotated[StrictInt, Field(ge=1)] | None = Field(
        None,
        description="Answer only the k largest entries of each row and their key indices (top_keys, top_values: "
        "[B, R, k], largest first, ties to the lower index) instead of the whole rows.",
    )
    renormalize: StrictBool = Field(
        False, description="Divide each row of the weights by its sum instead of refusing rows that do not sum to 1."
    )
    precision: Literal["float32", "float64"] = Field(
        "float32", description="The answer's dtype (the fusion and the products run in float64 either way)."
    )
    encoding: Literal["json", "base64"] = "json"


class RolloutResponse(BaseModel):
    """Body of a successful ``POST /v1/attention/rollout``."""

    rollout: OutTensor | None = Field(
        None,
        description="[B, L, L] = A_hat[last] @ ... @ A_hat[first], or [B, R, L] for the rows asked for: row i is how "
        "much output position i draws on each input token. Absent with top_k.",
    )
    top_keys: OutTensor | None = Field(
        None,
        description="With top_k: [B, R, k] integers, the key indices of each row's k largest entries, largest first "
        "(ties to the lower index).",
    )
    top_values: OutTensor | None = Field(
        None, description="With top_k: [B, R, k], those entries of the rollout, in the order of top_keys."
    )
    timing_ms: dict[str, float]
