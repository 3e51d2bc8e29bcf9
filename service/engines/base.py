"""The protocol every engine implements, and the optional capabilities the dispatcher, the runtime and the front
ends ask of some engines, each a protocol checked with ``isinstance`` (never ``getattr``).

- :class:`Engine`: what every engine has (name, provider, readiness, ``run``, ``describe``);
- :class:`BackwardEngine`: the backward pass;
- :class:`Startable`: loads and warms up at start-up; :class:`Closable`: releases what it holds at shutdown;
- :class:`Fallible`: a start-up that can fail for good, with the reason (degraded mode);
- :class:`Costed`: work and memory estimates of a task, for the budgets;
- :class:`GraphEngine`: runs exported graphs (ONNX): which graph runs a task, the verified models, the arena;
- :class:`Pooled`: a pool of worker threads that other work on arrays may share (the rollout's layers and rows).
"""

from __future__ import annotations

import re
import weakref
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, Protocol, TypeGuard, runtime_checkable

from service.core.backward import BackwardResult, BackwardTask
from service.core.types import AttentionResult, AttentionTask
from service.engines.cost import Cost


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
    sentence saying why not (shown to clients in invalid-input errors and in
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


@runtime_checkable
class Startable(Protocol):
    """An engine with work at start-up: load, verify, warm up (run in a worker thread; may raise)."""

    def start(self) -> None: ...


@runtime_checkable
class Closable(Protocol):
    """An engine that holds what must be released at shutdown (a thread pool)."""

    def close(self) -> None: ...


@runtime_checkable
class Fallible(Protocol):
    """An engine whose start-up can fail for good (it then stays not ready, and ``auto`` serves without it)."""

    @property
    def failed(self) -> bool: ...

    @property
    def failure(self) -> str | None:
        """Why start-up failed, fit for clients (no path, no hash); None while it has not."""

    @property
    def failure_detail(self) -> str | None:
        """Why start-up failed, for the server's log."""

    @property
    def not_ready_reason(self) -> str | None:
        """Why the engine is not ready now (starting, failed), or None when ready."""


@runtime_checkable
class Costed(Protocol):
    """An engine that estimates a forward task's work and memory (:class:`~service.engines.cost.Cost`)."""

    def cost(self, task: AttentionTask) -> Cost | None: ...


@runtime_checkable
class GraphEngine(Protocol):
    """An engine that runs exported graphs (ONNX): which graph runs a task (None: none does), its verified models,
    whether its runtime keeps a memory arena (memory not given back after large requests), and whether the memory
    it allocates afresh comes in transparent huge pages (a fault per 2 MiB rather than per 4 KiB).
    """

    memory_arena: bool
    malloc_huge_pages: bool

    def graph_for(self, task: AttentionTask) -> str | None: ...

    def backward_graph_for(self, task: BackwardTask) -> str | None: ...

    def models(self) -> dict[str, Any]: ...


@runtime_checkable
class Pooled(Protocol):
    """An engine whose worker threads other work on arrays may share (the rollout's layers and row blocks): the pool
    and its size while it is up (BLAS then runs one thread per call), ``(None, 1)`` while it is not.
    """

    def worker_pool(self) -> tuple[Executor | None, int]: ...


_CAPABILITIES: weakref.WeakKeyDictionary[Any, dict[type, bool]] = weakref.WeakKeyDictionary()
"""What each engine was found to have: ``isinstance`` against a runtime-checkable protocol walks the protocol's
members on every call (a few microseconds each in Python 3.11, several per tiny request); an engine's
capabilities do not change, so each is looked up once."""


def has_capability(engine: object, capability: type) -> bool:
    """``isinstance(engine, capability)`` for a capability protocol above, found once per engine."""
    try:
        known = _CAPABILITIES.get(engine)
        if known is None:
            known = _CAPABILITIES[engine] = {}
    except TypeError:  # an engine that cannot be weakly referenced (or hashed): looked up each time
        return isinstance(engine, capability)
    found = known.get(capability)
    if found is None:
        found = known[capability] = isinstance(engine, capability)
    return found


def with_backward(engine: object) -> TypeGuard[BackwardEngine]:
    return has_capability(engine, BackwardEngine)


def startable(engine: object) -> TypeGuard[Startable]:
    return has_capability(engine, Startable)


def closable(engine: object) -> TypeGuard[Closable]:
    return has_capability(engine, Closable)


def fallible(engine: object) -> TypeGuard[Fallible]:
    return has_capability(engine, Fallible)


def costed(engine: object) -> TypeGuard[Costed]:
    return has_capability(engine, Costed)


def runs_graphs(engine: object) -> TypeGuard[GraphEngine]:
    return has_capability(engine, GraphEngine)


def pooled(engine: object) -> TypeGuard[Pooled]:
    return has_capability(engine, Pooled)


_PATH = re.compile(r"(?<![\w.])(?:[A-Za-z]:)?[/\\][^\s'\"()\[\],;]+")
_HEX = re.compile(r"\b[0-9a-fA-F]{32,}\b")


def public_reason(text: str) -> str:
    """``text`` without absolute paths or long hex strings (hashes): what an answer to a client may show."""
    return _HEX.sub("<hash>", _PATH.sub("<path>", text))
