"""The bodies of ``POST /v1/sessions/{sequence_id}/steps`` and ``DELETE /v1/sessions/{sequence_id}``."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt

from service.dataplane.options import Alpha, NormalizerName, PositiveFloat
from service.http.v1.schemas import AttentionDiagnostics, EngineInfo, OutTensor, TensorField

StepReturn = Literal["output", "weights", "diagnostics"]


class SessionStepRequest(BaseModel):
    """Body of ``POST /v1/sessions/{sequence_id}/steps``: /v1/attention's fields for one step (no ``causal``: a step
    is aligned bottom_right; no ``key_lengths``), ``start`` and ``end``, and the cache's retention at the start.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    start: StrictBool = Field(False, description="This step starts the sequence (a live one of this id restarts).")
    end: StrictBool = Field(False, description="The sequence ends after this step (without tensors: it just ends).")
    query: TensorField | None = Field(None, description="(B, Hq, L_step, E), (Hq, L_step, E) or (L_step, E).")
    key: TensorField | None = Field(None, description="(B, Hkv, S_step, E): the positions appended; query's rank.")
    value: TensorField | None = Field(None, description="(B, Hkv, S_step, Ev); query's rank.")
    mask: TensorField | None = Field(
        None, description="Boolean or float, broadcastable to (B, Hq, L_step, cache_length after the append)."
    )
    scale: PositiveFloat | None = Field(None, description="Default 1/sqrt(E).")
    temperature: PositiveFloat = 1.0
    normalizer: NormalizerName = "softmax"
    alpha: Alpha | None = None
    engine: Literal["auto", "numpy", "onnx"] = "auto"
    precision: Literal["float32", "float64"] = Field("float32", description="Fixed at the start for the cache.")
    window: Annotated[StrictInt, Field(ge=1)] | None = Field(
        None, description="At the start: keep the last `window` positions besides the sinks (default: keep all)."
    )
    sinks: Annotated[StrictInt, Field(ge=0)] | None = Field(
        None, description="At the start, with a window: the sequence's first positions always kept (default 4)."
    )
    sink_positions: Annotated[StrictInt, Field(ge=0)] = Field(
        4, description="sink_mass is each row's weight on the sequence's positions 0 to sink_positions - 1."
    )
    return_: list[StepReturn] | None = Field(
        None,
        alias="return",
        max_length=3,
        description="Default: output, diagnostics, and the weights while they have at most 65,536 values.",
    )
    encoding: Literal["json", "base64"] = "json"


class SessionDiagnostics(AttentionDiagnostics):
    """Attention's per-row diagnostics over the whole row, and each row's ``sink_mass``."""

    sink_mass: Any


class SessionStepResponse(BaseModel):
    """Body of a successful step."""

    output: OutTensor | None = None
    weights: OutTensor | None = None
    diagnostics: SessionDiagnostics | None = None
    cache_length: int = Field(description="Positions the cache keeps after this step (0 once it ended).")
    positions_seen: int = Field(description="Positions appended since the start.")
    restarted: bool = Field(description="This start replaced a live sequence of the same id.")
    ended: bool
    engine: EngineInfo | None = None
    timing_ms: dict[str, float]


class SessionEndResponse(BaseModel):
    """Body of a successful ``DELETE /v1/sessions/{sequence_id}``."""

    sequence_id: int | str
    positions_seen: int
