"""Engine start-up: one engine that fails to start does not stop the others."""

from __future__ import annotations

from service.dataplane.runtime import Runtime
from service.engines.numpy_engine import NumpyEngine
from service.settings import Settings


class FailsToStart(NumpyEngine):
    name = "broken"

    def start(self) -> None:
        raise OSError("model directory unreadable")


def test_a_failing_engine_does_not_stop_the_others_from_starting() -> None:
    later = NumpyEngine(threads=2)
    engines = {"broken": FailsToStart(), "numpy": later}
    runtime = Runtime(Settings(enable_onnx=False), engines)
    runtime.start_engines()
    try:
        assert runtime.startup_done.is_set()
        assert later.describe()["threads"] == 2  # started: its worker pool exists
        assert runtime.startup_error == "broken: OSError: model directory unreadable"
        ready, details = runtime.readiness()
        assert details["error"] == runtime.startup_error
    finally:
        runtime.close_engines()
