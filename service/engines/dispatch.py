"""Choosing the engine for a request (interim version; the ONNX work replaces it)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from service.core.types import AttentionResult, AttentionTask
from service.engines.base import Engine, EngineChoice


class EngineUnavailable(Exception):
    """The requested engine cannot run this request (422)."""


class EngineNotReady(Exception):
    """The requested engine is not ready yet (503)."""


class EngineDispatcher:
    def __init__(self, engines: Mapping[str, Engine], preferred_auto_order: Sequence[str] = ("onnx", "numpy")) -> None:
        self.engines = dict(engines)
        self.order = [n for n in preferred_auto_order if n in self.engines]

    def select(self, task: AttentionTask, requested: str) -> tuple[Engine, EngineChoice]:
        if requested != "auto":
            engine = self.engines.get(requested)
            if engine is None:
                raise EngineUnavailable(f"engine {requested!r} is not enabled on this server")
            if not engine.ready:
                raise EngineNotReady(f"engine {requested!r} is not ready")
            reason = engine.unsupported_reason(task)
            if reason:
                raise EngineUnavailable(reason)
            return engine, EngineChoice(engine.name, engine.provider, "requested")
        notes = []
        for name in self.order:
            engine = self.engines[name]
            if not engine.ready:
                notes.append(f"{name} not ready")
                continue
            reason = engine.unsupported_reason(task)
            if reason:
                notes.append(reason)
                continue
            return engine, EngineChoice(engine.name, engine.provider, "auto: " + ("; ".join(notes) + "; " if notes else "") + f"{name} supports this request")
        raise EngineUnavailable("no engine supports this request: " + "; ".join(notes))

    def run(self, task: AttentionTask, requested: str) -> tuple[AttentionResult, EngineChoice]:
        engine, choice = self.select(task, requested)
        return engine.run(task), choice
