"""A model of the Open Inference Protocol: its tensors, its parameters, and how a request runs on it.

What the models share: reading the request parameters into the operations' typed options (unknown
parameters refused, every message naming the parameter or input), the compute precision from the
inputs' datatypes, and the response parameters (JSON text where a value is not a scalar).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import numpy as np
import orjson
from pydantic import BaseModel, ValidationError

from service.dataplane.context import Context
from service.dataplane.errors import invalid
from service.dataplane.inference import PROTOCOL_PARAMETERS, InferRequest, InferResult, TensorSpec
from service.dataplane.options import Encoding
from service.dataplane.scheduling import Job
from service.dataplane.sessions.store import MAX_STRING_ID, UINT64_MAX, SequenceId
from service.dataplane.tensors import TensorLimits, stack_limits
from service.dataplane.timing import Timing

MODEL_VERSION = "1"
PLATFORM = "attention_service"
FLOAT = ("FP32", "FP64")
"""The datatypes of float outputs: the compute precision's."""
FLOAT_IN = ("FP32", "FP64", "FP16")
"""The datatypes of float inputs: FP16 computes in float32 (as /v1's float16 tensors), and its outputs are FP32."""
MASK = ("BOOL", "FP32", "FP64", "FP16")
INDEX = ("INT64", "INT32")
"""The datatypes of integer inputs (lengths, token ids, labels): Triton's users often send INT32."""
PRECISIONS = {"FP16": "float32", "FP32": "float32", "FP64": "float64"}
"""The compute precision each float input datatype asks for."""

SESSION_MODEL = "attention_session"
"""The one stateful model (:mod:`.session`): the others refuse the sequence parameters."""
SEQUENCE_PARAMETERS = ("sequence_id", "sequence_start", "sequence_end")

Prepare = Callable[[Context, InferRequest, Timing], Job[InferResult]]
M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True, slots=True)
class Model:
    """One model: its tensors, the request parameters it reads (with their meaning), and how it runs."""

    name: str
    description: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    default_outputs: tuple[str, ...]
    parameters: Mapping[str, str]
    prepare: Prepare
    limits: Literal["tensors", "logits", "stacks"] = "tensors"
    """Size limits of the inputs: the attention tensors' (``ATTN_MAX_*``), the logits' (vocabulary-sized) or a stack
    of layers' weights (rank 5, each layer within the tensors' limits: :func:`.tensors.stack_limits`)."""
    stateful: bool = False
    """Reads the sequence parameters (``attention_session``); the other models refuse them."""

    def input_limits(self, ctx: Context) -> TensorLimits:
        if self.limits == "stacks":
            return stack_limits(ctx.limits)
        return ctx.logits_limits if self.limits == "logits" else ctx.limits

    def metadata(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "versions": [MODEL_VERSION],
            "platform": PLATFORM,
            "description": self.description,
            "inputs": [s.metadata() for s in self.inputs],
            "outputs": [s.metadata() for s in self.outputs],
            "parameters": dict(self.parameters),
        }

    @property
    def output_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.outputs)

    def wanted(self, request: InferRequest) -> list[str]:
        """The outputs to return: those the request lists, else the model's defaults."""
        return list(request.outputs) if request.outputs_given else list(self.default_outputs)


COMMON_PARAMETERS = {
    "normalizer": "string: softmax (default), sparsemax, entmax15, entmax (needs alpha), relu",
    "alpha": "number > 1, for normalizer entmax",
    "temperature": "number > 0 (default 1); divides the masked scores (a float mask too)",
    "diagnostics": "bool (default true): return diagnostics in the response parameters",
    "binary_data_output": "bool (default false): return every output not listed otherwise as binary data",
}


def response_encoding(request: InferRequest, outputs: Sequence[str]) -> Encoding:
    """How the answer's tensors are priced by the budget: ``binary`` (their raw size) when every output returned goes
    back as raw bytes (the binary tensor data extension over REST, raw contents over gRPC), else ``json`` (a JSON
    output costs up to 16 bytes a float32: the answer is priced at the larger size). The operations take one
    encoding for all outputs, so a mix is priced as JSON.
    """
    if outputs and all(request.outputs.get(name, request.binary_default) for name in outputs):
        return "binary"
    return "json"


def json_text(value: Any) -> str:
    """A response parameter that is not a scalar, as JSON text (numpy arrays and scalars included)."""
    return orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY, default=_plain).decode()


def _plain(obj: Any) -> Any:
    """What orjson's numpy path skips: 0-d and non-contiguous arrays, numpy scalars."""
    if isinstance(obj, np.ndarray | np.generic):
        return obj.tolist()
    raise TypeError(f"cannot serialize {type(obj).__name__}")


def precision_of(request: InferRequest, names: Sequence[str]) -> str:
    """The compute precision: FP64 inputs compute in float64, FP32 and FP16 in float32; the inputs must agree on it
    (FP16 beside FP32 is one precision: both compute in float32).
    """
    types = {request.datatypes[n] for n in names}
    precisions = {PRECISIONS[t] for t in types}
    if len(precisions) > 1:
        given = ", ".join(sorted(types))
        raise invalid(f"inputs {', '.join(names)} must share one precision (FP64, or FP32 and FP16), got {given}")
    return precisions.pop()


def option_fields(request: InferRequest, model: Model, names: Sequence[str]) -> dict[str, Any]:
    """The request parameters that are the model's options; unknown parameters are refused (a typo is not a
    default). Parameters of the protocol and of Triton's clients, and ``diagnostics``, are skipped; a stateless
    model refuses a sequence (:func:`refuse_sequence`).
    """
    if not model.stateful and any(name in request.parameters for name in SEQUENCE_PARAMETERS):
        refuse_sequence(request, model.name)  # parsed only when sent: not on every stateless request's path
    out: dict[str, Any] = {}
    for key, value in request.parameters.items():
        if key in names:
            out[key] = value
        elif key not in PROTOCOL_PARAMETERS and key != "diagnostics" and not key.startswith("triton_"):
            raise invalid(f"model {model.name!r} has no parameter {key!r}; it takes {', '.join(model.parameters)}")
    return out


def sequence_of(request: InferRequest) -> tuple[SequenceId | None, bool, bool]:
    """(sequence id or None for "no sequence", start, end), each refused naming the parameter when malformed."""
    params = request.parameters
    sequence_id = params.get("sequence_id", 0)
    if isinstance(sequence_id, bool) or not isinstance(sequence_id, int | str):
        raise invalid("parameter 'sequence_id' must be an unsigned integer or a string", "sequence_id")
    if isinstance(sequence_id, int) and not 0 <= sequence_id <= UINT64_MAX:
        raise invalid(f"parameter 'sequence_id' must lie in 0 to {UINT64_MAX}, got {sequence_id}", "sequence_id")
    if isinstance(sequence_id, str) and len(sequence_id) > MAX_STRING_ID:
        raise invalid(f"parameter 'sequence_id' is longer than {MAX_STRING_ID} characters", "sequence_id")
    start, end = flag(request, "sequence_start", False), flag(request, "sequence_end", False)
    return (None if sequence_id in (0, "") else sequence_id), start, end


def refuse_sequence(request: InferRequest, model: str) -> None:
    """A stateless model refuses a sequence (it would answer as if the sequence's earlier steps had not been)."""
    sequence_id, start, end = sequence_of(request)
    if sequence_id is not None or start or end:
        raise invalid(
            f"model {model!r} is stateless: it keeps no sequence, so sequence_id, sequence_start and sequence_end "
            f"would be ignored; send sequences to the model {SESSION_MODEL!r} (docs/guides/sessions.md)",
            "sequence_id",
        )


_DEFAULTS: dict[type[BaseModel], BaseModel] = {}
"""Each option model with every default, validated once: most requests set no option."""


def validated(schema: type[M], fields: dict[str, Any], model: Model) -> M:
    """The options validated once (the operations' option models), naming each offending parameter."""
    if not fields:
        default = _DEFAULTS.get(schema)
        if default is None:
            default = _DEFAULTS[schema] = schema.model_validate({})
        return default  # type: ignore[return-value]  # stored under its own type
    try:
        return schema.model_validate(fields)
    except ValidationError as exc:
        parts = []
        for err in exc.errors():
            loc = [str(p) for p in err.get("loc", ())]
            field = loc[0] if loc else ""
            kind = "input" if any(s.name == field for s in model.inputs) else "parameter"
            where = f"{kind} {field!r}" + "".join(f"[{p}]" for p in loc[1:])
            parts.append(f"{where}: {err.get('msg', 'invalid value')}")
        raise invalid("; ".join(parts) or "invalid parameters") from None


def flag(request: InferRequest, name: str, default: bool) -> bool:
    """A boolean request parameter."""
    value = request.parameters.get(name, default)
    if not isinstance(value, bool):
        raise invalid(f"parameter {name!r} must be true or false")
    return value
