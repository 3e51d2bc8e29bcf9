"""The typed options of the operations.

Each operation reads its scalar options through a protocol (:class:`AttentionOptionsLike`, ...): the
/v1 request models satisfy them as they are, and the pydantic models here (:class:`AttentionOptions`,
...) validate the same options when a protocol sends them apart from the tensors (the request
``parameters`` of the Open Inference Protocol, over REST and gRPC alike). Field names, types, bounds
and defaults are the /v1 fields' (the contract's names); so are the validation messages.
"""

from __future__ import annotations

from typing import Annotated, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt

from service.core.sampling import MAX_TOP_LOGPROBS

Precision = Literal["float32", "float64"]
Encoding = Literal["json", "base64", "binary"]
"""How the response carries its numbers (priced by the budget): JSON text, base64 text, raw bytes."""
Causal = Literal["top_left", "bottom_right"]
NormalizerName = Literal["softmax", "sparsemax", "entmax15", "entmax", "relu"]
EngineName = Literal["auto", "numpy", "onnx"]

PositiveFloat = Annotated[float, Field(strict=True, gt=0, allow_inf_nan=False)]
Alpha = Annotated[float, Field(strict=True, gt=1, allow_inf_nan=False)]
FiniteFloat = Annotated[float, Field(strict=True, allow_inf_nan=False)]

MAX_DRAWS = 1024
"""Largest ``n`` (draws per row) of a sample request."""
MAX_SEED = (1 << 63) - 1
SERVER_SEED_BITS = 53
"""Seeds the server draws fit in 53 bits, so that JavaScript numbers carry them back exactly."""


def causal_alignment(causal: bool | str) -> Causal | None:
    """``causal`` as the core takes it: ``True`` means ``"top_left"`` (PyTorch's ``is_causal``), ``False`` none."""
    if causal is True:
        return "top_left"
    if causal is False:
        return None
    return causal  # type: ignore[return-value]  # the request models allow only the two alignments


class AttentionOptionsLike(Protocol):
    """The scalar options of attention (and of its backward pass)."""

    @property
    def normalizer(self) -> str: ...
    @property
    def alpha(self) -> float | None: ...
    @property
    def scale(self) -> float | None: ...
    @property
    def temperature(self) -> float: ...
    @property
    def causal_alignment(self) -> Causal | None: ...
    @property
    def engine(self) -> str: ...


class SoftmaxOptionsLike(Protocol):
    @property
    def axis(self) -> int: ...
    @property
    def temperature(self) -> float: ...
    @property
    def normalizer(self) -> str: ...
    @property
    def alpha(self) -> float | None: ...
    @property
    def log(self) -> bool: ...


class SampleOptionsLike(Protocol):
    @property
    def temperature(self) -> float: ...
    @property
    def top_k(self) -> int: ...
    @property
    def top_p(self) -> float: ...
    @property
    def min_p(self) -> float: ...
    @property
    def repetition_penalty(self) -> float: ...
    @property
    def presence_penalty(self) -> float: ...
    @property
    def frequency_penalty(self) -> float: ...
    @property
    def n(self) -> int: ...
    @property
    def seed(self) -> int | None: ...
    @property
    def top_logprobs(self) -> int: ...


class CalibrateOptionsLike(Protocol):
    @property
    def method(self) -> str: ...
    @property
    def bins(self) -> int: ...


class _Options(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class AttentionOptions(_Options):
    """The scalar options of attention, alone (the request parameters of the model ``attention``)."""

    causal: StrictBool | Causal = False
    scale: PositiveFloat | None = None
    temperature: PositiveFloat = 1.0
    normalizer: NormalizerName = "softmax"
    alpha: Alpha | None = None
    engine: EngineName = "auto"

    @property
    def causal_alignment(self) -> Causal | None:
        return causal_alignment(self.causal)


class SessionOptions(_Options):
    """The scalar options of a session step (the request parameters of the model ``attention_session``; the /v1
    step body's fields): attention's, but no ``causal`` (a step is always aligned ``bottom_right``), plus the
    cache's retention (set at the sequence's start) and the sink positions of the ``sink_mass`` diagnostic.
    """

    scale: PositiveFloat | None = None
    temperature: PositiveFloat = 1.0
    normalizer: NormalizerName = "softmax"
    alpha: Alpha | None = None
    engine: EngineName = "auto"
    window: Annotated[StrictInt, Field(ge=1)] | None = None
    """Keep the sequence's last ``window`` positions (besides its sinks); None keeps every position."""
    sinks: Annotated[StrictInt, Field(ge=0)] | None = None
    """With a window: the sequence's first positions always kept (StreamingLLM's attention sinks; default 4)."""
    sink_positions: Annotated[StrictInt, Field(ge=0)] = 4
    """``sink_mass`` is the weight on the sequence's positions 0 to ``sink_positions`` - 1."""


class SoftmaxOptions(_Options):
    """The scalar options of softmax, alone (the request parameters of the model ``softmax``)."""

    axis: StrictInt = -1
    temperature: PositiveFloat = 1.0
    normalizer: NormalizerName = "softmax"
    alpha: Alpha | None = None
    log: StrictBool = False


class SampleOptions(_Options):
    """The scalar options of sampling, alone (the request parameters of the model ``sample``)."""

    repetition_penalty: PositiveFloat = 1.0
    frequency_penalty: FiniteFloat = 0.0
    presence_penalty: FiniteFloat = 0.0
    temperature: Annotated[float, Field(strict=True, ge=0, allow_inf_nan=False)] = 1.0
    top_k: Annotated[StrictInt, Field(ge=0)] = 0
    top_p: Annotated[float, Field(strict=True, gt=0, le=1, allow_inf_nan=False)] = 1.0
    min_p: Annotated[float, Field(strict=True, ge=0, lt=1, allow_inf_nan=False)] = 0.0
    n: Annotated[StrictInt, Field(ge=1, le=MAX_DRAWS)] = 1
    seed: Annotated[StrictInt, Field(ge=0, le=MAX_SEED)] | None = None
    top_logprobs: Annotated[StrictInt, Field(ge=0, le=MAX_TOP_LOGPROBS)] = 0


class CalibrateOptions(_Options):
    """The scalar options of calibration, alone (the request parameters of the model ``calibrate``)."""

    method: Literal["temperature"] = "temperature"
    bins: Annotated[StrictInt, Field(ge=1, le=1000)] = 15
