"""What one running service holds: its settings, engines and dispatcher.

Built by :func:`service.app.create_app` and reached by routes through
``request.app.state.runtime``.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from service.api.memory import MemoryBudget
from service.engines.base import Engine
from service.engines.dispatch import EngineDispatcher
from service.settings import Settings

logger = logging.getLogger("service")


@dataclass
class Runtime:
    """The engines of one process and their start-up state."""

    settings: Settings
    engines: dict[str, Engine]
    dispatcher: EngineDispatcher
    started_at: float = field(default_factory=time.time)
    startup_done: threading.Event = field(default_factory=threading.Event)
    startup_error: str | None = None
    memory: MemoryBudget | None = None
    """The process-wide budget of estimated bytes in flight (``ATTN_MEMORY_BUDGET_BYTES``)."""

    def start_engines(self) -> None:
        """Start (load and warm up) every engine that has a ``start`` method; runs in a worker thread.

        Each engine is started on its own: one that fails is logged and named in
        ``startup_error``, and the others still start.
        """
        errors = []
        for engine in self.engines.values():
            start = getattr(engine, "start", None)
            if not callable(start):
                continue
            t0 = time.perf_counter()
            try:
                start()
            except Exception as exc:
                errors.append(f"{engine.name}: {type(exc).__name__}: {exc}")
                logger.exception("engine %s failed to start", engine.name)
                continue
            logger.info(
                "engine %s started in %.1f ms (ready=%s, provider=%s)",
                engine.name,
                (time.perf_counter() - t0) * 1e3,
                engine.ready,
                engine.provider,
            )
        self.startup_error = "; ".join(errors) or None
        self.startup_done.set()

    def close_engines(self) -> None:
        """Release what engines hold (thread pools, sessions) at shutdown."""
        self.startup_done.wait(timeout=60)
        for engine in self.engines.values():
            close = getattr(engine, "close", None)
            if callable(close):
                try:
                    close()
                except Exception:
                    logger.exception("closing engine %s failed", engine.name)

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        """(ready, details): ready once start-up finished and every configured engine is ready."""
        engines = {name: bool(engine.ready) for name, engine in self.engines.items()}
        ready = self.startup_done.is_set() and all(engines.values())
        details: dict[str, Any] = {"ready": ready, "starting": not self.startup_done.is_set(), "engines": engines}
        if self.startup_error:
            details["error"] = self.startup_error
        return ready, details
