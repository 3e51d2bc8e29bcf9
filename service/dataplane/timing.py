"""The phases of one request, timed: ``timing_ms`` in the answers, and spans while tracing is on."""

from __future__ import annotations

import time
from collections.abc import Sequence

from service.observability.spans import record_phases


class Timing:
    """The phases of one request: each :meth:`phase` call ends the phase it names, which began at the
    previous call (or at the start); :meth:`skip` leaves a wait out of every phase and of the total.
    """

    __slots__ = ("last", "phases")

    def __init__(self, start: float | None = None) -> None:
        self.last = time.perf_counter() if start is None else start
        self.phases: list[tuple[str, float, float]] = []

    def phase(self, name: str) -> None:
        """The phase ``name`` ends now."""
        now = time.perf_counter()
        self.phases.append((name, self.last, now))
        self.last = now

    def skip(self) -> None:
        """The time since the last phase ended was a wait (for a worker thread), not work."""
        self.last = time.perf_counter()

    def ms(self, order: Sequence[str] = ()) -> dict[str, float]:
        """Milliseconds of each phase (those in ``order`` first, in that order), and their total.

        Also records the phases as spans of the current trace (:func:`record_phases`).
        """
        phases: dict[str, float] = {}
        total = 0.0
        for name, t0, t1 in self.phases:
            total += t1 - t0
            phases[name] = round((t1 - t0) * 1e3, 3)
        out = {name: phases.pop(name) for name in order if name in phases}
        out.update(phases)
        out["total"] = round(total * 1e3, 3)
        record_phases(self.phases)
        return out
