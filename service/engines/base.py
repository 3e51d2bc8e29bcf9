"""The protocol every engine implements."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from service.core.backward import BackwardResult, BackwardTask
from service.core.types import AttentionResult, AttentionTask


@dataclass(frozen=True, slots=True)
class EngineChoice:
    """Which engine ran a request, on which provider, and why it was chosen."""

    name: str
    provider: str
    reason: str


@runtime_checkable
class Engine(Protocol):
    """An attention engine.

    ``unsupported_reason`` returns None when the engine can run the task, or a
    sentence saying why not (shown to clients in 422 errors and in
    ``engine.reason``). ``run`` must honour docs/concepts/contract.md exactly, fully masked
    rows included.
    """

    name: str

    @property
    def provider(self) -> str: ...

    @property
    def ready(self) -> bool: ...

    def unsupported_reason(self, task: AttentionTask) -> str | None: ...

    def run(self, task: AttentionTask) -> AttentionResult: ...

    def describe(self) -> dict[str, Any]: ...


@runtime_checkable
class BackwardEngine(Protocol):
    """An optional capability of an :class:`Engine`: the backward pass (``POST /v1/attention/backward``).

    ``backward_unsupported_reason`` works like ``unsupported_reason``; the
    dispatcher treats engines without these two methods as unable to run any
    backward task. ``run_backward`` must honour the contract's "Gradients".
    """

    def backward_unsupported_reason(self, task: BackwardTask) -> str | None: ...

    def run_backward(self, task: BackwardTask) -> BackwardResult: ...


_PATH = re.compile(r"(?<![\w.])(?:[A-Za-z]:)?[/\\][^\s'\"()\[\],;]+")
_HEX = re.compile(r"\b[0-9a-fA-F]{32,}\b")


def public_reason(text: str) -> str:
    """``text`` without absolute paths or long hex strings (hashes): what an answer to a client may show."""
    return _HEX.sub("<hash>", _PATH.sub("<path>", text))
