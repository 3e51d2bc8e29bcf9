"""Inference requests of the Open Inference Protocol, decoded: what REST (/v2) and gRPC both hand to a model.

A front end turns its wire form (JSON and the binary extension, or protobuf with raw contents) into an
:class:`InferRequest` of numpy arrays, using :func:`input_spec`, :func:`input_dtype` and
:func:`check_input_shape` on each input as it goes, :func:`check_complete` at the end, and
:func:`check_output` and :func:`output_as_binary` for the outputs; a model answers
with an :class:`InferResult` (named arrays and response parameters) that the front end encodes. Every
refusal is an ``INVALID`` service error whose message names the input, output or parameter.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from service.dataplane.errors import invalid
from service.dataplane.tensors import TensorLimits, check_shape

DATATYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(bool),
    "UINT8": np.dtype("<u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
}
"""The protocol's fixed-size datatypes (BYTES has no use here and is refused)."""

OUTPUT_DATATYPES: dict[np.dtype, str] = {
    np.dtype(np.float32): "FP32",
    np.dtype(np.float64): "FP64",
    np.dtype(bool): "BOOL",
    np.dtype(np.int64): "INT64",
}

PROTOCOL_PARAMETERS = frozenset(
    {"binary_data_output", "timeout", "priority", "sequence_id", "sequence_start", "sequence_end"}
)
"""Request parameters of the protocol and of Triton's clients that carry no meaning here."""


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """A model input or output: the datatypes it takes (the first is advertised) and its ranks."""

    name: str
    datatypes: tuple[str, ...]
    min_rank: int = 2
    max_rank: int = 4
    optional: bool = False
    description: str = ""

    def metadata(self) -> dict[str, Any]:
        """The protocol's ``$metadata_tensor``, plus what its one shape cannot say.

        ``shape`` has the largest rank taken, every dimension variable (-1): a client that builds its inputs from
        it sends that rank, which every input takes. ``ranks`` lists every rank taken (smaller ranks mean leading
        axes of size 1), ``datatypes`` every datatype; neither is in the protocol's schema (nor in gRPC's
        ``TensorMetadata``, which has no room for them: the gRPC guide lists them).
        """
        meta: dict[str, Any] = {"name": self.name, "datatype": self.datatypes[0], "shape": [-1] * self.max_rank}
        meta["ranks"] = list(range(self.min_rank, self.max_rank + 1))
        if len(self.datatypes) > 1:
            meta["datatypes"] = list(self.datatypes)
        if self.optional:
            meta["optional"] = True
        if self.description:
            meta["description"] = self.description
        return meta


@dataclass(slots=True)
class InferRequest:
    """A decoded inference request: the inputs as arrays, and what the client asked of the outputs."""

    id: str | None
    parameters: dict[str, Any]
    inputs: dict[str, np.ndarray]
    datatypes: dict[str, str]
    outputs: dict[str, bool] = field(default_factory=dict)
    """Requested output names, in request order, each with "return as binary" (raw, over gRPC)."""
    outputs_given: bool = False
    binary_default: bool = False
    """Outputs the client did not list are returned as binary (``binary_data_output``; raw over gRPC)."""
    caller: str = ""
    """Who asks (:attr:`~service.dataplane.door.Call.caller`): the owner of the sequences it names."""


@dataclass(slots=True)
class InferResult:
    """A model's answer: the outputs asked for (name, array), in order, and the response parameters."""

    outputs: list[tuple[str, np.ndarray]]
    parameters: dict[str, Any]


def input_spec(model: str, specs: Mapping[str, TensorSpec], name: str, seen: Iterable[str]) -> TensorSpec:
    """The spec of the input ``name``: refused when the model has no such input or it came twice."""
    spec = specs.get(name)
    if spec is None:
        raise invalid(f"model {model!r} has no input {name!r}; its inputs are {', '.join(specs)}")
    if name in seen:
        raise invalid(f"input {name!r} is given twice")
    return spec


def input_dtype(spec: TensorSpec, datatype: object) -> np.dtype:
    """The numpy dtype of an input sent as ``datatype``: refused when the model does not take it there."""
    if not isinstance(datatype, str) or datatype not in spec.datatypes:
        raise invalid(f"input {spec.name!r} has datatype {datatype!r}; it takes {' or '.join(spec.datatypes)}")
    return DATATYPES[datatype]


def check_input_shape(spec: TensorSpec, shape: tuple[int, ...], limits: TensorLimits) -> None:
    """Refuse an input shape outside the model's ranks or the limits."""
    if spec.max_rank == 1:  # a vector (key_lengths): one size limit
        if len(shape) != 1 or not 1 <= shape[0] <= limits.max_dim:
            raise invalid(
                f"input {spec.name!r} must be a vector of 1 to {limits.max_dim} values, got shape {list(shape)}"
            )
        return
    check_shape(shape, spec.name, limits, spec.min_rank)


def check_complete(model: str, specs: Sequence[TensorSpec], given: Iterable[str]) -> None:
    """Every required input of the model is there."""
    present = set(given)
    missing = [s.name for s in specs if not s.optional and s.name not in present]
    if missing:
        raise invalid(f"model {model!r} needs input {', '.join(repr(m) for m in missing)}")


def check_output(model: str, known: Sequence[str], requested: Iterable[str], name: str) -> None:
    """Refuse an output the model does not have, or one asked for twice."""
    if name not in known:
        raise invalid(f"model {model!r} has no output {name!r}; its outputs are {', '.join(known)}")
    if name in requested:
        raise invalid(f"output {name!r} is requested twice")


def output_as_binary(name: str, params: Mapping[str, Any], binary_default: bool) -> bool:
    """Whether the output ``name`` goes back as binary (raw), from its parameters."""
    if params.get("classification"):
        raise invalid(f"output {name!r}: the classification extension is not supported")
    binary = params.get("binary_data", binary_default)
    if not isinstance(binary, bool):
        raise invalid(f"output {name!r}: parameters.binary_data must be true or false")
    return binary


def refuse_shared_memory(params: Mapping[str, Any], where: str) -> None:
    """The shared memory extension is not supported: the data must come with the request."""
    for key in ("shared_memory_region", "shared_memory_byte_size", "shared_memory_offset"):
        if key in params:
            raise invalid(f"{where}: the shared memory extension is not supported; send the data in the body")
