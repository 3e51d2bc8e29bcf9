"""The Open Inference Protocol's REST objects, for the OpenAPI schema only.

Names and fields follow the protocol's own OpenAPI document (KServe ``rest_predict_v2.yaml``:
``inference_request``, ``request_input``, ``request_output``, ``inference_response``,
``response_output``, ``metadata_server_response``, ``metadata_model_response``,
``metadata_tensor``), and Triton's statistics extension (``ModelStatisticsResponse``). The /v2
routes parse and write these bodies themselves (:mod:`service.http.v2.tensors`); these models
only describe them.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema

_SCALAR = {"anyOf": [{"type": "number"}, {"type": "boolean"}, {"type": "string"}]}


def _nested(item: dict[str, Any], rank: int) -> dict[str, Any]:
    schema = item
    for _ in range(rank):
        schema = {"type": "array", "items": schema}
    return schema


TENSOR_DATA_SCHEMA: dict[str, Any] = {
    "description": "Tensor contents in row-major order: a flat array, or nested arrays of the tensor's shape.",
    "anyOf": [_nested(_SCALAR, rank) for rank in range(1, 6)],
}
PARAMETERS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "Protocol parameters: string, number or boolean values.",
    "additionalProperties": {"anyOf": [{"type": "string"}, {"type": "number"}, {"type": "boolean"}]},
}

TensorData = Annotated[Any, WithJsonSchema(TENSOR_DATA_SCHEMA)]
Parameters = Annotated[dict[str, Any], WithJsonSchema(PARAMETERS_SCHEMA)]
Shape = list[Annotated[int, Field(ge=-1)]]


class _Doc(BaseModel):
    model_config = ConfigDict(extra="allow")


class RequestInput(_Doc):
    """An input tensor: JSON ``data``, or ``parameters.binary_data_size`` bytes after the JSON (binary extension)."""

    name: str
    shape: Shape
    datatype: str = Field(description="BOOL, FP16, FP32, FP64, INT32, INT64, ... (each model's metadata says which)")
    parameters: Parameters | None = None
    data: TensorData | None = None


class RequestOutput(_Doc):
    """An output asked for; ``parameters.binary_data`` asks for it as binary data."""

    name: str
    parameters: Parameters | None = None


class InferenceRequest(_Doc):
    """The protocol's inference request; options (``normalizer``, ``causal``, ...) are request ``parameters``."""

    id: str | None = None
    parameters: Parameters | None = None
    inputs: list[RequestInput]
    outputs: list[RequestOutput] | None = None


class ResponseOutput(_Doc):
    """An output tensor: JSON ``data``, or ``parameters.binary_data_size`` bytes after the JSON."""

    name: str
    shape: Shape
    datatype: str
    parameters: Parameters | None = None
    data: TensorData | None = None


class InferenceResponse(_Doc):
    """The protocol's inference response; diagnostics, engine and timings are response ``parameters``."""

    model_name: str
    model_version: str | None = None
    id: str | None = None
    parameters: Parameters | None = None
    outputs: list[ResponseOutput]


class MetadataTensor(_Doc):
    """The protocol's ``metadata_tensor``, plus what its one shape cannot say (not in the protocol's schema)."""

    name: str
    datatype: str = Field(description="the first of the datatypes the tensor takes")
    shape: Shape = Field(description="the largest rank the tensor takes, every size variable (-1)")
    ranks: list[int] | None = Field(None, description="every rank the tensor takes (smaller: leading axes of size 1)")
    datatypes: list[str] | None = Field(None, description="every datatype the tensor takes, when several")
    optional: bool | None = Field(None, description="true for an input a request may leave out")
    description: str | None = None


class ModelMetadata(_Doc):
    """``GET /v2/models/{name}``: the model's tensors, and the parameters it reads."""

    name: str
    versions: list[str] | None = None
    platform: str
    inputs: list[MetadataTensor] | None = None
    outputs: list[MetadataTensor] | None = None


class ServerMetadata(_Doc):
    name: str
    version: str
    extensions: list[str]


class ServerLive(_Doc):
    live: bool


class ServerReady(_Doc):
    ready: bool


class ModelReady(_Doc):
    name: str
    ready: bool


class StatisticDuration(_Doc):
    """A count, and the total time of what it counts in nanoseconds."""

    count: int
    ns: int


class InferStatistics(_Doc):
    success: StatisticDuration
    fail: StatisticDuration
    queue: StatisticDuration
    compute_input: StatisticDuration
    compute_infer: StatisticDuration
    compute_output: StatisticDuration
    cache_hit: StatisticDuration | None = None
    cache_miss: StatisticDuration | None = None


class InferBatchStatistics(_Doc):
    batch_size: int
    compute_input: StatisticDuration
    compute_infer: StatisticDuration
    compute_output: StatisticDuration


class ModelStatistics(_Doc):
    """One model version's statistics since the server started (Triton's statistics extension)."""

    name: str
    version: str | None = None
    last_inference: int = Field(description="When the last successful request ended, in ms since the epoch (0: none)")
    inference_count: int
    execution_count: int
    inference_stats: InferStatistics
    batch_stats: list[InferBatchStatistics]


class ModelStatisticsResponse(_Doc):
    """``GET /v2/models[/{name}[/versions/{version}]]/stats``."""

    model_stats: list[ModelStatistics]


class ProtocolError(_Doc):
    """The protocol's error body."""

    error: str


V2_MODELS: list[type[BaseModel]] = [
    InferenceRequest,
    InferenceResponse,
    ModelMetadata,
    ServerMetadata,
    ServerLive,
    ServerReady,
    ModelReady,
    ModelStatisticsResponse,
    ProtocolError,
]
