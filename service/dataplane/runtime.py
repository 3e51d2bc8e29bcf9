"""The engines of one data plane: their start-up (in a worker thread, beside the server) and readiness.

Readiness is one state that every probe reads alike (REST ``/readyz`` and ``/v2/health/ready``, gRPC
``ServerReady``, ``ModelReady`` and ``grpc.health.v1.Health``): ready once the engines' start-up is over and
every required engine is ready, not ready again from the moment the server begins to stop
(:meth:`Runtime.begin_stopping`, called from the SIGTERM or SIGINT handler itself). The two events that change
it call the listeners (:meth:`Runtime.on_change`), so that a ``Watch`` stream hears of each change as it
happens, not at the next poll.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from service.engines.base import Engine, closable, fallible, public_reason, startable
from service.settings import Settings

logger = logging.getLogger("service")


@dataclass
class Runtime:
    """The engines of one data plane and their start-up state."""

    settings: Settings
    engines: dict[str, Engine]
    started_at: float = field(default_factory=time.time)
    startup_done: threading.Event = field(default_factory=threading.Event)
    startup_error: str | None = None
    _start_errors: dict[str, str] = field(default_factory=dict)
    """Engines whose ``start`` raised, with the reason fit for clients."""
    stopping: bool = False
    """The server has begun to stop (SIGTERM or SIGINT): not ready, whatever the engines."""
    _listeners: list[Callable[[], None]] = field(default_factory=list)

    def on_change(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` (from any thread, so it must only schedule work) whenever readiness may change."""
        self._listeners.append(listener)

    def _changed(self) -> None:
        for listener in list(self._listeners):
            try:
                listener()
            except Exception:  # a listener whose loop has closed must not stop the others
                logger.debug("a readiness listener failed", exc_info=True)

    def begin_serving(self) -> None:
        """A serving period begins (the app's start-up): not stopping. An app started again after a stop (tests
        reuse one) serves again.
        """
        self.stopping = False

    def begin_stopping(self) -> None:
        """The server stops: from now on every probe says not ready (safe in a signal handler: a flag and calls
        that schedule work).
        """
        if not self.stopping:
            self.stopping = True
            self._changed()

    @property
    def required_engines(self) -> frozenset[str]:
        """Engines without which the service is not ready: numpy always, ONNX with ``ATTN_ONNX_REQUIRED``.

        Another engine that fails to start leaves the service ready in degraded mode: ``auto``
        serves every request on the engines that did start (docs/concepts/engines.md, "Degraded mode").
        """
        required = {"numpy"}
        if self.settings.onnx_required:
            required.add("onnx")
        return frozenset(required)

    def failed_engines(self) -> dict[str, str]:
        """Engines whose start-up failed, each with the reason fit for clients (no path, no hash)."""
        failed: dict[str, str] = {}
        for name, engine in self.engines.items():
            if name in self._start_errors:
                failed[name] = self._start_errors[name]
            elif fallible(engine) and engine.failed:
                reason = engine.failure or engine.not_ready_reason
                failed[name] = public_reason(str(reason or "start-up failed"))
        return failed

    def start_engines(self) -> None:
        """Start (load and warm up) every engine that has a ``start`` method; runs in a worker thread.

        Each engine is started on its own: one that fails is named in ``startup_error``, and the
        others still start. A failure is logged as one ERROR line (with the server-side detail),
        which says whether the service degrades to the other engines or is not ready.
        """
        errors = []
        for name, engine in self.engines.items():
            start = engine.start if startable(engine) else None
            if start is None:
                continue
            t0 = time.perf_counter()
            try:
                start()
            except Exception as exc:
                errors.append(f"{name}: {type(exc).__name__}: {exc}")
                self._start_errors[name] = public_reason(f"{type(exc).__name__}: {exc}")
                self._log_failure(name, f"{type(exc).__name__}: {exc}", exc_info=True)
                continue
            detail = failure_detail(engine)
            if detail is not None:
                self._log_failure(name, detail)
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
        self._changed()

    def _log_failure(self, name: str, detail: str, *, exc_info: bool = False) -> None:
        others = ", ".join(n for n in self.engines if n != name) or "none"
        if name in self.required_engines:
            consequence = f"it is required ({'ATTN_ONNX_REQUIRED=true' if name == 'onnx' else 'always'}): not ready"
        else:
            consequence = (
                f"degraded mode: ready, every request is served by the other engines ({others}); "
                + ("set ATTN_ONNX_REQUIRED=true to fail readiness instead" if name == "onnx" else "")
            ).rstrip("; ")
        logger.error(
            "engine %s failed to start: %s; %s",
            name,
            detail,
            consequence,
            exc_info=exc_info,
            extra={"engine": name, "engine_failed": True, "degraded": name not in self.required_engines},
        )

    def close_engines(self) -> None:
        """Release what engines hold (thread pools, sessions) at shutdown."""
        self.startup_done.wait(timeout=60)
        for name, engine in self.engines.items():
            close = engine.close if closable(engine) else None
            if close is not None:
                try:
                    close()
                except Exception:
                    logger.exception("closing engine %s failed", name)

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        """(ready, details): ready once start-up finished and every engine is ready, except engines
        that failed to start and are not required (degraded mode: ``degraded`` true, ``failed``
        names each with its reason). The details carry no server path and no hash.
        """
        engines = {name: bool(engine.ready) for name, engine in self.engines.items()}
        failed = self.failed_engines() if self.startup_done.is_set() else {}
        required = self.required_engines
        blocking = [n for n, ok in engines.items() if not ok and (n in required or n not in failed)]
        ready = self.startup_done.is_set() and not blocking and not self.stopping
        details: dict[str, Any] = {
            "ready": ready,
            "starting": not self.startup_done.is_set(),
            "stopping": self.stopping,
            "degraded": ready and bool(failed),
            "engines": engines,
            "required": sorted(n for n in required if n in engines),
        }
        if failed:
            details["failed"] = failed
        if self.startup_error:
            details["error"] = public_reason(self.startup_error)
        return ready, details

    def not_ready_reason(self) -> str | None:
        """Why the server is not ready (a sentence for clients), or None when it is."""
        if self.startup_done.is_set() and not self.stopping and all(engine.ready for engine in self.engines.values()):
            return None  # the usual case, checked on every inference request without building the details
        ready, details = self.readiness()
        if ready:
            return None
        if self.stopping:
            return "the server is stopping"
        if details.get("starting"):
            return "the engines are starting"
        waiting = [name for name, ok in details.get("engines", {}).items() if not ok]
        reason = f"engine {', '.join(waiting)} is not ready" if waiting else "not ready"
        return reason + (f" ({details['error']})" if details.get("error") else "")


def failure_detail(engine: object) -> str | None:
    """Why ``engine``'s start-up failed, for the server's log; None when it did not (or cannot fail)."""
    if not (fallible(engine) and engine.failed):
        return None
    return engine.failure_detail or engine.not_ready_reason or "start-up failed"
