"""Spans of the request's phases while tracing is on (:mod:`service.http.tracing` turns it on).

With tracing off, :func:`span` and :func:`record_phases` cost one context-variable read. Nothing here
imports OpenTelemetry or a web framework: the data plane opens its spans through this module.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from contextvars import ContextVar
from typing import Any

CURRENT_TRACER: ContextVar[Any | None] = ContextVar("attn_tracer", default=None)
"""The tracer of the app serving the current request (None: tracing off). Worker threads inherit it."""

PHASES = {"decode": "decode", "encode": "encode", "diagnostics": "diagnostics"}
"""Timing marks of the handlers that become spans (the engine has a live span of its own)."""


_NO_SPAN: AbstractContextManager[None] = nullcontext()
"""What :func:`span` gives while tracing is off (stateless, so one instance serves every call)."""


def span(name: str, attributes: dict[str, Any] | None = None) -> AbstractContextManager[Any]:
    """A child span of the current one while tracing is on; nothing otherwise (a shared no-op context,
    not a generator: the engine call opens one per request).
    """
    tracer = CURRENT_TRACER.get()
    if tracer is None:
        return _NO_SPAN
    cm: AbstractContextManager[Any] = tracer.start_as_current_span(name, attributes=attributes)
    return cm


def record_phases(phases: Sequence[tuple[str, float, float]]) -> None:
    """Spans for timed phases: ``(name, start, end)`` in ``perf_counter`` seconds.

    Requests already time their phases for ``timing_ms``; turning them into spans afterwards keeps the
    request path unchanged. Only the names in :data:`PHASES` become spans.
    """
    tracer = CURRENT_TRACER.get()
    if tracer is None:
        return
    offset_ns = time.time_ns() - time.perf_counter_ns()  # perf_counter -> epoch, drift negligible here
    for name, t0, t1 in phases:
        if name in PHASES:
            phase = tracer.start_span(PHASES[name], start_time=offset_ns + int(t0 * 1e9))
            phase.end(end_time=offset_ns + int(t1 * 1e9))
