"""Pydantic models of ``POST /v1/sample`` and ``POST /v1/calibrate`` (names fixed by docs/concepts/fixed-names.md)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, WithJsonSchema

from service.core.sampling import MAX_TOP_LOGPROBS
from service.dataplane.options import MAX_DRAWS, MAX_SEED, FiniteFloat
from service.http.v1.schemas import OutTensor, TensorField

PreviousTokens = Annotated[
    list[Any],
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "array", "items": {"type": "integer", "minimum": 0}},
                {"type": "array", "items": {"type": "array", "items": {"type": "integer", "minimum": 0}}},
            ]
        }
    ),
]
"""Checked by :func:`service.core.sampling.previous_token_pairs`, which names the offending element
(``["previous_tokens", row, i]``) where a pydantic union would name its branches."""
SampleReturn = Literal["tokens", "logprobs", "raw_logprobs", "top_logprobs", "probabilities", "diagnostics"]
DEFAULT_RETURN: tuple[SampleReturn, ...] = ("tokens", "logprobs", "diagnostics")


class SampleRequest(BaseModel):
    """Body of ``POST /v1/sample`` (the contract's "Logits post-processing": the steps run in this order)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    logits: TensorField = Field(description="(V,) or (N, V); finite.")
    mask: TensorField | None = Field(
        None, description="Step 1. Boolean (true = keep) or float (added), broadcastable to the logits."
    )
    repetition_penalty: Annotated[float, Field(strict=True, gt=0, allow_inf_nan=False)] = Field(
        1.0, description="Step 2, on each distinct previous token: z / r where z > 0, z * r otherwise (CTRL)."
    )
    frequency_penalty: FiniteFloat = Field(0.0, description="Step 3: minus this times the token's count.")
    presence_penalty: FiniteFloat = Field(0.0, description="Step 3: minus this once for each token that occurred.")
    previous_tokens: PreviousTokens | None = Field(
        None, description="Token ids seen so far: one list for every row, or one list per row; ids in [0, V)."
    )
    temperature: Annotated[float, Field(strict=True, ge=0, allow_inf_nan=False)] = Field(
        1.0, description="Step 4: divides the logits; 0 = greedy (argmax, lowest id on ties; steps 5-7 skipped)."
    )
    top_k: Annotated[StrictInt, Field(ge=0)] = Field(
        0, description="Step 5: keep the values >= the k-th largest (ties kept); 0 = off."
    )
    top_p: Annotated[float, Field(strict=True, gt=0, le=1, allow_inf_nan=False)] = Field(
        1.0, description="Step 6: keep tokens, most probable first, while the mass before them is < top_p; 1 = off."
    )
    min_p: Annotated[float, Field(strict=True, ge=0, lt=1, allow_inf_nan=False)] = Field(
        0.0, description="Step 7: keep tokens with p >= min_p * max p; 0 = off."
    )
    n: Annotated[StrictInt, Field(ge=1, le=MAX_DRAWS)] = Field(1, description="Draws per row.")
    seed: Annotated[StrictInt, Field(ge=0, le=MAX_SEED)] | None = Field(
        None,
        description=(
            "Seed of the Philox generator: the same request and seed give the same tokens. "
            "Without one the server draws a seed (< 2**53) and returns it."
        ),
    )
    top_logprobs: Annotated[StrictInt, Field(ge=0, le=MAX_TOP_LOGPROBS)] = Field(
        0, description="How many of the most probable tokens of each row's final distribution to list."
    )
    return_: list[SampleReturn] = Field(default_factory=lambda: list(DEFAULT_RETURN), alias="return", max_length=6)
    precision: Literal["float32", "float64"] = Field("float32", description="Compute dtype and response dtype.")
    encoding: Literal["json", "base64"] = "json"


class TopLogprob(BaseModel):
    token: int
    logprob: float


class SampleDiagnostics(BaseModel):
    """Per row (scalars for (V,) logits, lists for (N, V))."""

    entropy_raw: Any = Field(description="Entropy (nats) of softmax(logits) as given.")
    entropy: Any = Field(description="Entropy (nats) of the final distribution.")
    kept: Any = Field(description="Tokens with nonzero final probability.")
    removed_mass: Any = Field(
        description="Mass, under the softmax of step 4's values, of the tokens steps 5-7 removed."
    )


class SampleResponse(BaseModel):
    """Body of a successful ``POST /v1/sample``; each field present when asked for in ``return``."""

    tokens: OutTensor | None = Field(None, description="(n,) or (N, n) token ids.")
    logprobs: OutTensor | None = Field(
        None, description="Log-probabilities of the tokens under the final distribution."
    )
    raw_logprobs: OutTensor | None = Field(
        None, description="Log-probabilities of the tokens under log_softmax(logits)."
    )
    top_logprobs: list[TopLogprob] | list[list[TopLogprob]] | None = None
    probabilities: OutTensor | None = Field(None, description="The final distribution, the logits' shape.")
    diagnostics: SampleDiagnostics | None = None
    seed: int
    timing_ms: dict[str, float]


class CalibrateRequest(BaseModel):
    """Body of ``POST /v1/calibrate``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    logits: TensorField = Field(description="(N, C): one row of class logits per example; finite.")
    labels: list[StrictInt] = Field(description="N class indices in [0, C).")
    method: Literal["temperature"] = "temperature"
    bins: Annotated[StrictInt, Field(ge=1, le=1000)] = Field(15, description="Equal-width confidence bins for ECE.")


class BeforeAfter(BaseModel):
    before: float
    after: float


class ReliabilityBin(BaseModel):
    lower: float
    upper: float
    count: int
    confidence: float | None = Field(description="Mean confidence in the bin; null when the bin is empty.")
    accuracy: float | None = Field(description="Accuracy in the bin; null when the bin is empty.")


class Reliability(BaseModel):
    before: list[ReliabilityBin]
    after: list[ReliabilityBin]


class CalibrateResponse(BaseModel):
    """Body of a successful ``POST /v1/calibrate``."""

    temperature: float = Field(description="The fitted T (divide the logits by it).")
    nll: BeforeAfter
    ece: BeforeAfter
    accuracy: float
    reliability: Reliability
    bounded: bool = Field(description="True when the optimum lies at an end of [0.01, 100].")
    timing_ms: dict[str, float]
