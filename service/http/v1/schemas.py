"""Pydantic models of the /v1 requests and responses (the contract's field names).

Tensor fields are typed :data:`TensorField`: pydantic passes them through
untouched (walking a large nested list per element would be slow) and
:mod:`service.http.codecs.tensors` decodes them straight into numpy; the JSON
schema still documents the three wire forms for OpenAPI. The scalar options
have the types and bounds of :mod:`service.dataplane.options`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, GetCoreSchemaHandler, StrictBool, StrictInt
from pydantic_core import core_schema

from service.dataplane.options import Alpha, Causal, NormalizerName, PositiveFloat, causal_alignment

_DTYPES = ["float32", "float64", "float16", "bool"]
_SHAPE = {"type": "array", "items": {"type": "integer", "minimum": 1}, "minItems": 1, "maxItems": 5}
_NUMBER_OR_BOOL = {"anyOf": [{"type": "number"}, {"type": "boolean"}]}
_NUMBER_OR_NULL = {"anyOf": [{"type": "number"}, {"type": "null"}]}
_FLAT_REF = {"$ref": "#/components/schemas/FlatTensor"}
_B64_REF = {"$ref": "#/components/schemas/Base64Tensor"}
_B64_OUT_REF = {"$ref": "#/components/schemas/Base64OutputTensor"}


def _nested(item: dict[str, Any], rank: int) -> dict[str, Any]:
    """A rank-``rank`` nested array of ``item``, with ``items`` at every level (SDK generators need them)."""
    schema = item
    for _ in range(rank):
        schema = {"type": "array", "items": schema}
    return schema


FLAT_TENSOR_JSON_SCHEMA: dict[str, Any] = {
    "type": "object",
    "title": "FlatTensor",
    "description": "A tensor as its shape and its flat C-order values.",
    "required": ["shape", "dtype", "data"],
    "additionalProperties": False,
    "properties": {
        "shape": _SHAPE,
        "dtype": {"type": "string", "enum": _DTYPES},
        "data": {"type": "array", "items": _NUMBER_OR_BOOL},
    },
}
BASE64_TENSOR_JSON_SCHEMA: dict[str, Any] = {
    "type": "object",
    "title": "Base64Tensor",
    "description": "A tensor as the base64 of its little-endian C-order bytes.",
    "required": ["shape", "dtype", "b64"],
    "additionalProperties": False,
    "properties": {
        "shape": _SHAPE,
        "dtype": {"type": "string", "enum": _DTYPES},
        "b64": {"type": "string", "contentEncoding": "base64"},
    },
}
BASE64_OUTPUT_TENSOR_JSON_SCHEMA: dict[str, Any] = {
    "type": "object",
    "title": "Base64OutputTensor",
    "description": (
        "An answer's tensor as the base64 of its little-endian C-order bytes (token ids and key indices are int64)."
    ),
    "required": ["shape", "dtype", "b64"],
    "properties": {
        "shape": {"type": "array", "items": {"type": "integer", "minimum": 0}},
        "dtype": {"type": "string", "enum": [*_DTYPES, "int64"]},
        "b64": {"type": "string", "contentEncoding": "base64"},
    },
}
TENSOR_JSON_SCHEMA: dict[str, Any] = {
    "title": "Tensor",
    "description": (
        "A tensor in one of three wire forms: a nested JSON array (rectangular, rank 1 to 4 as the field requires, 5 "
        "for the stack of layers of /v1/attention/rollout); "
        "{shape, dtype, data} with flat C-order data; or {shape, dtype, b64} with the base64 of the "
        "little-endian C-order bytes. Values must be finite."
    ),
    "anyOf": [*(_nested(_NUMBER_OR_BOOL, rank) for rank in range(1, 6)), _FLAT_REF, _B64_REF],
    "examples": [[[1.0, 0.0], [0.0, 1.0]], {"shape": [2, 2], "dtype": "float32", "b64": "AACAPwAAAEAAAEBAAACAQA=="}],
}
OUT_TENSOR_JSON_SCHEMA: dict[str, Any] = {
    "title": "OutputTensor",
    "description": (
        "A nested JSON array (default) or, with encoding 'base64', {shape, dtype, b64}. "
        "Masked scores (-inf) are written as null in JSON arrays."
    ),
    "anyOf": [*(_nested(_NUMBER_OR_NULL, rank) for rank in range(1, 5)), _B64_OUT_REF],
    "examples": [[[0.66976154, 0.33023846, 0.0]], {"shape": [2], "dtype": "float32", "b64": "AACAPwAAAEA="}],
}
TENSOR_COMPONENTS: dict[str, dict[str, Any]] = {
    "Tensor": TENSOR_JSON_SCHEMA,
    "OutputTensor": OUT_TENSOR_JSON_SCHEMA,
    "FlatTensor": FLAT_TENSOR_JSON_SCHEMA,
    "Base64Tensor": BASE64_TENSOR_JSON_SCHEMA,
    "Base64OutputTensor": BASE64_OUTPUT_TENSOR_JSON_SCHEMA,
}
"""The tensor components of the OpenAPI schema (docs.py adds them): one ``$ref`` per tensor field, the object
forms as components of their own (SDK generators take unions of references, not of inline objects)."""

INT64_MAX = (1 << 63) - 1


KEY_LENGTH_RANGE = "a key length is an integer from 0 to S, the number of keys"
"""The rule the core applies (``0 <= key_lengths[b] <= S``), in the words of every refusal of a key length."""


def _int64(value: Any) -> Any:
    """Refuse integers that no int64 holds (orjson reads 2**64 and above as floats): out of range by the same rule as
    any length above S (the core's check, which names S, needs an int64 array).
    """
    if isinstance(value, int) and not isinstance(value, bool) and not -INT64_MAX - 1 <= value <= INT64_MAX:
        raise ValueError(f"{value} is out of range ({KEY_LENGTH_RANGE})")
    if isinstance(value, float) and value.is_integer() and abs(value) > INT64_MAX:
        raise ValueError(f"{value:.0f} is out of range ({KEY_LENGTH_RANGE})")
    return value


KeyLength = Annotated[StrictInt, Field(ge=0), BeforeValidator(_int64)]
TokenId = Annotated[StrictInt, Field(ge=-INT64_MAX - 1, le=INT64_MAX)]
"""One token id of ``token_ids``: any integer an int64 holds."""
"""One entry of ``key_lengths``: a non-negative integer that an int64 holds (the core checks it against S)."""


def _inlined(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with the form references replaced by the forms: a self-contained JSON schema."""
    forms = {
        _FLAT_REF["$ref"]: FLAT_TENSOR_JSON_SCHEMA,
        _B64_REF["$ref"]: BASE64_TENSOR_JSON_SCHEMA,
        _B64_OUT_REF["$ref"]: BASE64_OUTPUT_TENSOR_JSON_SCHEMA,
    }
    return {**schema, "anyOf": [forms.get(part.get("$ref", ""), part) for part in schema["anyOf"]]}


def _json_schema_type(name: str, schema: dict[str, Any]) -> Any:
    """A pass-through type (no per-element validation: codecs.py decodes tensors into numpy) that fields
    refer to as the component ``name``; pydantic's own JSON schema of it is self-contained.
    """
    standalone = _inlined(schema)

    def core(source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return core_schema.any_schema(ref=name, metadata={"pydantic_js_functions": [lambda _s, _h: dict(standalone)]})

    return type(
        name, (), {"__get_pydantic_core_schema__": classmethod(lambda cls, source, handler: core(source, handler))}
    )


TensorField = Annotated[Any, _json_schema_type("Tensor", TENSOR_JSON_SCHEMA)]
OutTensor = Annotated[Any, _json_schema_type("OutputTensor", OUT_TENSOR_JSON_SCHEMA)]
ReturnName = Literal["output", "weights", "scores", "diagnostics", "gradient_health", "inspection", "norm_weights"]


def _default_return() -> list[ReturnName]:
    return ["output", "weights", "diagnostics"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class AttentionFields(_Strict):
    """The fields of ``POST /v1/attention`` that its backward pass shares."""

    query: TensorField = Field(description="(B, Hq, L, E), (H, L, E) or (L, E).")
    key: TensorField = Field(description="(B, Hkv, S, E) with Hq % Hkv == 0; same rank as query.")
    value: TensorField = Field(description="(B, Hkv, S, Ev); same rank as query.")
    mask: TensorField | None = Field(
        None,
        description=(
            "Boolean (true = may attend) or float (added to the scores, -inf allowed in the b64 form), "
            "broadcastable to (B, Hq, L, S). A float mask is divided by the temperature with the scores."
        ),
    )
    causal: StrictBool | Literal["top_left", "bottom_right"] = Field(
        False,
        description="true means 'top_left' (PyTorch is_causal); "
        "'bottom_right' aligns the last query with the last key.",
    )
    key_lengths: list[KeyLength] | None = Field(
        None, description="One length per batch: key j of batch b is valid iff j < key_lengths[b]."
    )
    scale: PositiveFloat | None = Field(None, description="Default 1/sqrt(E).")
    temperature: PositiveFloat = Field(1.0, description="Divides the masked scores before the normalizer.")
    normalizer: NormalizerName = "softmax"
    alpha: Alpha | None = Field(
        None, description="Required for normalizer 'entmax' (alpha > 1; 2 is sparsemax, 1.5 is entmax15)."
    )
    engine: Literal["auto", "numpy", "onnx"] = "auto"
    precision: Literal["float32", "float64"] = "float32"
    return_: list[ReturnName] = Field(default_factory=_default_return, alias="return", max_length=7)
    encoding: Literal["json", "base64"] = "json"

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @property
    def causal_alignment(self) -> Causal | None:
        return causal_alignment(self.causal)


class AttentionRequest(AttentionFields):
    """Body of ``POST /v1/attention``."""

    sink_positions: Annotated[StrictInt, Field(ge=0)] = Field(
        4, description="With 'inspection': sink_mass is each head's mean weight on keys 0 to sink_positions - 1."
    )
    token_ids: list[list[TokenId]] | None = Field(
        None,
        description="With 'inspection', [B, S] token ids (L == S): the previous-token, duplicate-token and induction "
        "scores per head (TransformerLens' head detector, its 'mul' measure).",
    )
    exclude_bos: StrictBool = Field(False, description="Pattern scores leave the first key's column out.")
    exclude_current_token: StrictBool = Field(False, description="Pattern scores leave the diagonal out.")


class SoftmaxRequest(_Strict):
    """Body of ``POST /v1/softmax``."""

    logits: TensorField = Field(description="Any rank 1 to 4.")
    axis: StrictInt = Field(-1, description="The axis normalized over.")
    temperature: PositiveFloat = 1.0
    normalizer: NormalizerName = "softmax"
    alpha: Alpha | None = None
    log: StrictBool = Field(False, description="Also return log-probabilities (softmax only).")
    mask: TensorField | None = Field(
        None, description="Boolean (true = keep) or float (added to the logits), broadcastable to the logits."
    )
    precision: Literal["float32", "float64"] = "float32"
    encoding: Literal["json", "base64"] = "json"


class EngineInfo(BaseModel):
    """Which engine ran the request, on which provider, and why."""

    name: Literal["numpy", "onnx"]
    provider: str
    reason: str


class HeadDiagnostics(BaseModel):
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


class HeadGradientHealth(BaseModel):
    """Per (batch, query head), over its rows with at least two valid keys."""

    batch: int
    head: int
    mean_jacobian_norm: float = Field(description="Mean Frobenius norm of the normalizer's Jacobian dA/dZ.")
    vanishing_fraction: float = Field(description="Fraction of rows whose Jacobian norm is below the threshold.")
    rows: int = Field(description="Rows counted (at least two valid keys).")


class GradientHealthReport(BaseModel):
    """Gradient health (the contract's "Gradient health"): how much gradient the normalizer lets through, per head."""

    threshold: float = Field(description="A row's gradient vanishes when its Jacobian norm is below this.")
    heads: list[HeadGradientHealth]


class HeadInspection(BaseModel):
    """Per (batch, query head): docs/concepts/diagnostics.md, "Inspection"."""

    batch: int
    head: int
    sink_mass: float = Field(description="Mean over live rows of the weight on keys 0 to sink_positions - 1.")
    spectral_norm: float = Field(description="Largest singular value of Q K^T * scale / T, before masks.")
    live_rows: int = Field(description="Rows with at least one valid key.")
    previous_token_score: float | None = Field(None, description="With token_ids: TransformerLens' 'mul' score.")
    duplicate_token_score: float | None = Field(None, description="With token_ids: TransformerLens' 'mul' score.")
    induction_score: float | None = Field(None, description="With token_ids: TransformerLens' 'mul' score.")
    norm_max_share: float = Field(description="Mean over rows of the largest ||A_ij v_j|| over the row's sum.")
    norm_argmax_agreement: float = Field(
        description="Share of rows whose largest ||A_ij v_j|| is at the largest weight A_ij."
    )


class InspectionReport(BaseModel):
    """Per-head inspection: sinks, the entropy-collapse bound, head patterns, norm-based weights."""

    sink_positions: int
    heads: list[HeadInspection]


class ScoreStats(BaseModel):
    min: float
    max: float
    mean: float
    std: float
    count: int


class AttentionDiagnostics(BaseModel):
    """Per-row arrays have the query's shape without its last axis."""

    model_config = ConfigDict(extra="allow")

    entropy: Any
    normalized_entropy: Any
    max_weight: Any
    argmax: Any
    effective_support: Any
    zeros: Any
    attention_distance: Any
    heads: list[HeadDiagnostics]
    fully_masked_rows: int
    row_sum_max_error: float
    non_finite: int
    saturated_rows: int
    score_stats: ScoreStats | None


class AttentionResponse(BaseModel):
    """Body of a successful ``POST /v1/attention``."""

    output: OutTensor | None = None
    weights: OutTensor | None = None
    scores: OutTensor | None = None
    diagnostics: AttentionDiagnostics | None = None
    gradient_health: GradientHealthReport | None = None
    inspection: InspectionReport | None = None
    norm_weights: OutTensor | None = Field(
        None, description="||A_ij v_j||, the weights' shape (Kobayashi et al. 2020); with 'norm_weights' in return."
    )
    engine: EngineInfo
    timing_ms: dict[str, float]


class SoftmaxDiagnostics(BaseModel):
    model_config = ConfigDict(extra="allow")

    entropy: Any
    max: Any
    argmax: Any


class SoftmaxResponse(BaseModel):
    """Body of a successful ``POST /v1/softmax``."""

    probabilities: OutTensor
    log_probabilities: OutTensor | None = None
    diagnostics: SoftmaxDiagnostics
    timing_ms: dict[str, float]


class Problem(BaseModel):
    """RFC 9457 problem details."""

    model_config = ConfigDict(extra="allow")

    type: str
    title: str
    status: int
    detail: str
    errors: list[dict[str, Any]] | None = None
