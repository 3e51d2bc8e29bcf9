"""The models of the Open Inference Protocol that REST (/v2) and gRPC both serve: their names, metadata and
readiness, and how a decoded request runs on each.

- ``base``: :class:`Model` and what the models share (parameters into options, precision, JSON text);
- ``attention``: ``attention`` and ``attention_backward``;
- ``logits``: ``softmax``, ``sample`` and ``calibrate``;
- ``session``: ``attention_session`` (a key/value cache per sequence);
- ``rollout``: ``attention_rollout`` (attention rollout across layers).
"""

from __future__ import annotations

from service.dataplane.errors import not_found
from service.dataplane.models.attention import ATTENTION, ATTENTION_BACKWARD
from service.dataplane.models.base import MODEL_VERSION, Model
from service.dataplane.models.logits import CALIBRATE, SAMPLE, SOFTMAX
from service.dataplane.models.rollout import ATTENTION_ROLLOUT
from service.dataplane.models.session import ATTENTION_SESSION

MODELS: dict[str, Model] = {
    m.name: m for m in (ATTENTION, SOFTMAX, ATTENTION_BACKWARD, SAMPLE, CALIBRATE, ATTENTION_SESSION, ATTENTION_ROLLOUT)
}
"""Every model, by name, in the order the server lists them."""

SERVER_NAME = "attention-service"
EXTENSIONS = ["binary_tensor_data", "parameters", "statistics"]
"""The protocol's extensions every server has, named as Triton names them (``GET /v2``, gRPC ``ServerMetadata``)."""
SEQUENCE_EXTENSIONS = ["sequence", "sequence(string_id)"]
"""Triton's names of the sequence extension (integer and string ids), where sessions are served."""


def server_extensions(sessions: bool) -> list[str]:
    """The extensions a server lists: the sequence extension's where it serves sessions."""
    return EXTENSIONS + SEQUENCE_EXTENSIONS if sessions else list(EXTENSIONS)


def find_model(name: str, version: str | None = None) -> Model:
    """The model ``name`` (at ``version``, when given): ``NOT_FOUND`` for a model or version the server lacks."""
    model = MODELS.get(name)
    if model is None:
        raise not_found(f"unknown model {name!r}; this server has {', '.join(MODELS)}")
    if version is not None and version != MODEL_VERSION:
        raise not_found(f"model {name!r} has no version {version!r}; its versions are {MODEL_VERSION}")
    return model


__all__ = ["EXTENSIONS", "MODELS", "MODEL_VERSION", "SERVER_NAME", "Model", "find_model", "server_extensions"]
