"""Issue 29 item 2: what the dispatcher, the runtime and the front ends ask of an engine is declared, as protocols
checked with ``isinstance``; each engine has exactly the capabilities it claims, and an engine with only the
:class:`~service.engines.base.Engine` members (a test double, a third engine) is served without them.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest

from service.core.types import AttentionInputs, AttentionResult, AttentionTask
from service.dataplane.runtime import Runtime
from service.engines.base import (
    BackwardEngine,
    Closable,
    Costed,
    Engine,
    Fallible,
    GraphEngine,
    Startable,
)
from service.engines.dispatch import EngineDispatcher
from service.engines.numpy_engine import NumpyEngine
from service.engines.onnx_engine import OnnxEngine
from service.export import DEFAULT_MODELS_DIR
from service.settings import Settings

CAPABILITIES = (Engine, BackwardEngine, Startable, Closable, Fallible, Costed, GraphEngine)


@pytest.mark.parametrize(
    ("engine", "has"),
    [
        (NumpyEngine(), {Engine, BackwardEngine, Startable, Closable, Costed}),
        (OnnxEngine(DEFAULT_MODELS_DIR), {Engine, BackwardEngine, Startable, Fallible, Costed, GraphEngine}),
    ],
    ids=["numpy", "onnx"],
)
def test_each_engine_declares_its_capabilities(engine: Any, has: set[type]) -> None:
    assert {p for p in CAPABILITIES if isinstance(engine, p)} == has


class Minimal:
    """An engine with the Engine protocol's members only: it answers zeros."""

    name = "minimal"
    provider = "test"
    ready = True

    def unsupported_reason(self, task: AttentionTask) -> str | None:
        return None

    def run(self, task: AttentionTask) -> AttentionResult:
        q = task.inputs.query
        return AttentionResult(output=q * 0, weights=None, scores=None, valid_keys=None)  # type: ignore[arg-type]

    def describe(self) -> dict[str, Any]:
        return {"name": self.name}


def test_an_engine_with_only_the_engine_members_starts_serves_and_closes() -> None:
    engine = Minimal()
    assert isinstance(engine, Engine) and not any(
        isinstance(engine, p) for p in (BackwardEngine, Startable, Closable, Fallible, Costed, GraphEngine)
    )
    runtime = Runtime(settings=Settings(enable_onnx=False), engines={"numpy": NumpyEngine(), "minimal": engine})
    runtime.start_engines()
    deadline = time.monotonic() + 10
    while runtime.not_ready_reason() is not None:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert runtime.failed_engines() == {}
    dispatcher = EngineDispatcher(runtime.engines, preferred_auto_order=("minimal", "numpy"))
    ones = np.ones((1, 2), dtype=np.float32)
    _, choice = dispatcher.run(AttentionTask(AttentionInputs(ones, ones, ones)), "minimal")
    assert choice.name == "minimal" and choice.reason == "requested: minimal"
    runtime.close_engines()
