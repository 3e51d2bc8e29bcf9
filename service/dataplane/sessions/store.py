"""The live sessions of one data plane: who owns each, the memory their caches hold, the order of their steps,
and when they go.

- **Ownership**: a session is found by (caller, sequence id). The caller is the API key's fingerprint (one
  caller for all without keys), so another key asking for the same id finds nothing: the answer is the one an
  unknown id gets. Ids are Triton's: a positive integer or a non-empty string (``7`` and ``"7"`` are two
  sequences).
- **Order**: :meth:`SessionStore.using` holds a session's lock for a whole step (append, attend, commit), so the
  steps of one sequence run one at a time, in the order they reach it; two sequences never share a cache.
- **Memory**: the caches hold their bytes on a share of the plane's memory budget (``ATTN_SESSION_CACHE_BYTES``).
  A cache that needs more first evicts idle sessions, least recently used first; a session with a step in flight
  is never evicted. With nothing to evict the step is ``UNAVAILABLE`` with a retry hint.
- **Idle**: a session with no step for ``ATTN_SESSION_IDLE_S`` is evicted by a sweeper thread (every half second
  at most), so an abandoned session is gone within its idle time and half a second. The sweeper also reports the
  totals (sessions, bytes, positions) to the observer, so that a step does not walk every session.
- **Caps**: ``ATTN_SESSION_MAX_PER_KEY`` live sessions per caller (``UNAVAILABLE``: one key cannot fill the
  budget); ``ATTN_SESSION_MAX_POSITIONS`` positions per cache (checked by the step).
- **Gone**: a sequence that ended or was evicted is remembered (the last 4,096), so its next step is refused
  naming what happened and when, not as if it had never been.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

from service.dataplane.errors import ServiceError, invalid, unavailable
from service.dataplane.memory import BudgetShare, MemoryLease, mib
from service.dataplane.sessions.cache import KVCache, Layout, Retention

SequenceId = int | str
MAX_STRING_ID = 256
"""Longest string sequence id (Triton's string ids name Kubernetes objects and the like)."""
UINT64_MAX = (1 << 64) - 1
"""Largest integer sequence id (the protocol's uint64)."""
Key = tuple[str, SequenceId]
EVICTION_REASONS = ("idle", "pressure", "restarted", "stream_closed")
"""Why a session went without its own end (the metrics' ``reason``)."""
START_WORDS = 'sequence_start=true, or "start": true on /v1'
"""How a refusal says to start a sequence, in the words of both forms."""
GONE_REMEMBERED = 4096
"""How many ended or evicted sequences are remembered, for the words of their next step's refusal."""


def describe(sequence_id: SequenceId) -> str:
    """``sequence 7`` or ``sequence 'chat-12'``, as messages name a sequence."""
    return f"sequence {sequence_id}" if isinstance(sequence_id, int) else f"sequence {sequence_id!r}"


class SessionObserver(Protocol):
    """What the store reports (the service's metrics implement it): no label names a sequence."""

    def sessions_changed(self, live: int, cache_bytes: int, positions: int) -> None: ...

    def session_evicted(self, reason: str) -> None: ...

    def session_stepped(self) -> None: ...


@dataclass(eq=False)
class Session:
    """One live sequence: its cache, the bytes the cache holds, its lock and its use."""

    key: Key
    cache: KVCache
    lease: MemoryLease
    sink_positions: int
    started: float
    last_used: float
    lock: threading.Lock = field(default_factory=threading.Lock)
    in_flight: int = 0
    live: bool = True
    steps: int = 0


@dataclass(frozen=True, slots=True)
class Gone:
    """Why a sequence is no longer live, and when."""

    reason: str
    """``ended``, ``idle``, ``pressure`` (evicted for another cache's room), ``restarted`` or ``stream_closed``."""
    at: float
    idle_s: float


class SessionStore:
    """The sessions of one data plane (module docstring). Thread-safe."""

    def __init__(
        self,
        share: BudgetShare,
        *,
        idle_s: float,
        max_positions: int,
        max_per_key: int,
        observer: SessionObserver | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.share = share
        self.idle_s = idle_s
        self.max_positions = max_positions
        self.max_per_key = max_per_key
        self.observer = observer
        self.clock = clock
        self.sessions: OrderedDict[Key, Session] = OrderedDict()
        """Live sessions, least recently used first."""
        self.gone: OrderedDict[Key, Gone] = OrderedDict()
        self.per_caller: dict[str, int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._sweeper: threading.Thread | None = None

    # -- lookup and life ------------------------------------------------------------------------------------------

    def peek(self, caller: str, sequence_id: SequenceId) -> Session | None:
        """The live session, if any (for a step's estimates; :meth:`using` is what a step relies on)."""
        return self.sessions.get((caller, sequence_id))

    def refusal(self, caller: str, sequence_id: SequenceId) -> ServiceError:
        """Why a step of a sequence that is not live is refused: never started, ended or evicted (and when)."""
        name = describe(sequence_id)
        gone = self.gone.get((caller, sequence_id))
        restart = f"; start it again ({START_WORDS})"
        if gone is None:
            return invalid(
                f"{name} is not live: it was never started on this server ({START_WORDS} on its first step)",
                "sequence_id",
            )
        ago = self.clock() - gone.at
        if gone.reason == "ended":
            return invalid(f"{name} has ended ({ago:.1f} s ago){restart}", "sequence_id")
        if gone.reason == "stream_closed":
            return invalid(
                f"{name} ended {ago:.1f} s ago when the gRPC stream that carried it closed "
                f"(ATTN_SESSION_END_WITH_STREAM){restart}",
                "sequence_id",
            )
        if gone.reason == "idle":
            why = f"after {gone.idle_s:.1f} s without a step (ATTN_SESSION_IDLE_S)"
        else:  # pressure
            why = f"to make room for another session's cache, idle for {gone.idle_s:.1f} s (least recently used)"
        return invalid(f"{name} was evicted {ago:.1f} s ago {why}{restart}", "sequence_id")

    def _reserve_for(self, lease: MemoryLease, keep: Key) -> Callable[[int], None]:
        """The cache's reservations: on the share, evicting idle sessions (not ``keep``'s) when it has no room."""

        def reserve(nbytes: int) -> None:
            while True:
                try:
                    lease.reserve(nbytes)
                    return
                except ServiceError:
                    if not self._evict_one_idle(keep):
                        raise unavailable(
                            f"the session caches are full: they hold {mib(self.share.reserved)} of "
                            f"{mib(self.share.capacity)} (ATTN_SESSION_CACHE_BYTES), and no other session is idle to "
                            f"evict; this step needs {mib(nbytes)} more; retry after {self.share.retry_after_s} s",
                            self.share.retry_after_s,
                        ) from None

        return reserve

    @contextlib.contextmanager
    def using(
        self,
        caller: str,
        sequence_id: SequenceId,
        *,
        start: tuple[Layout, Retention, int] | None = None,
    ) -> Iterator[tuple[Session, bool]]:
        """Hold a session for one step: (the session, whether a live one was restarted). ``start``: (layout,
        retention, sink positions) begins the sequence (a live one of that id ends first); else the live session
        (refused, naming why, when it is not live). The session's lock is held inside; when the step raises, a
        session it started is removed.
        """
        key = (caller, sequence_id)
        restarted = False
        with self._lock:
            if start is not None:
                old = self.sessions.get(key)
                if old is not None:
                    restarted = True
                    self._drop(old, "restarted")
                elif self.per_caller.get(caller, 0) >= self.max_per_key:
                    raise unavailable(
                        f"this caller holds {self.max_per_key} live sessions, the most one API key may hold "
                        "(ATTN_SESSION_MAX_PER_KEY); end one (sequence_end, or DELETE /v1/sessions/{id}) or let it "
                        "idle out "
                        f"({self.idle_s:g} s)",
                        self.share.retry_after_s,
                    )
                session = self._begin(key, *start)
            else:
                found = self.sessions.get(key)
                if found is None:
                    raise self.refusal(caller, sequence_id)
                session = found
            session.in_flight += 1
        began = start is not None
        try:
            with session.lock:
                if not session.live:  # ended or restarted by the step before this one
                    raise self.refusal(caller, sequence_id)
                try:
                    yield session, restarted
                except BaseException:
                    if began and session.live:
                        with self._lock:
                            self._drop(session, None)
                    raise
                session.steps += 1
                if self.observer is not None:
                    self.observer.session_stepped()
        finally:
            with self._lock:
                session.in_flight -= 1
                session.last_used = self.clock()
                if session.live:
                    self.sessions.move_to_end(key)
            if began or not session.live:
                self._changed()

    def _begin(self, key: Key, layout: Layout, retention: Retention, sink_positions: int) -> Session:
        now = self.clock()
        lease = self.share.lease()
        session = Session(
            key=key,
            cache=KVCache(layout, retention, self.max_positions, self._reserve_for(lease, key)),
            lease=lease,
            sink_positions=sink_positions,
            started=now,
            last_used=now,
        )
        self.sessions[key] = session
        self.gone.pop(key, None)
        self.per_caller[key[0]] = self.per_caller.get(key[0], 0) + 1
        self._start_sweeper()
        return session

    def end(self, session: Session) -> None:
        """The sequence ended (a step with ``sequence_end``): its cache is freed at once."""
        with self._lock:
            if session.live:
                self._drop(session, "ended")
        self._changed()

    def end_sequence(self, caller: str, sequence_id: SequenceId) -> int:
        """End a live sequence now, after a step of it in flight (an end without tensors, ``DELETE``): the positions
        it had seen; refused, naming why, when it is not live.
        """
        with self.using(caller, sequence_id) as (session, _):
            seen = session.cache.seen
            self.end(session)
        return seen

    def end_idle(self, caller: str, sequence_id: SequenceId, reason: str) -> bool:
        """End a live sequence now unless a step of it is in flight (a gRPC stream that carried it closed:
        ``reason`` ``stream_closed``); whether it ended.
        """
        with self._lock:
            session = self.sessions.get((caller, sequence_id))
            if session is None or session.in_flight:
                return False
            self._drop(session, reason)
        self._changed()
        return True

    def _drop(self, session: Session, reason: str | None) -> None:
        """Remove a live session (the store's lock held); remembered as gone for ``reason`` (None: forgotten)."""
        session.live = False
        key = session.key
        self.sessions.pop(key, None)
        left = self.per_caller.get(key[0], 1) - 1
        if left > 0:
            self.per_caller[key[0]] = left
        else:
            self.per_caller.pop(key[0], None)
        session.lease.release()
        if reason is not None and reason != "restarted":
            self.gone[key] = Gone(reason, self.clock(), self.clock() - session.last_used)
            self.gone.move_to_end(key)
            while len(self.gone) > GONE_REMEMBERED:
                self.gone.popitem(last=False)
        if reason in EVICTION_REASONS and self.observer is not None:
            self.observer.session_evicted(reason)

    def _evict_one_idle(self, keep: Key) -> bool:
        """Evict the least recently used session without a step in flight (not ``keep``'s); False when none."""
        with self._lock:
            for session in self.sessions.values():
                if session.key != keep and session.in_flight == 0:
                    self._drop(session, "pressure")
                    return True
        return False

    # -- idle eviction ----------------------------------------------------------------------------------------------

    def sweep(self) -> int:
        """Evict every session idle for ``idle_s`` or more (none with a step in flight); how many went."""
        now = self.clock()
        evicted = 0
        with self._lock:
            for session in list(self.sessions.values()):
                if now - session.last_used < self.idle_s:
                    break  # least recently used first: the rest are younger
                if session.in_flight == 0:
                    self._drop(session, "idle")
                    evicted += 1
        if evicted:
            self._changed()
        return evicted

    def _start_sweeper(self) -> None:
        if self._sweeper is None and not self._stop.is_set():
            self._sweeper = threading.Thread(target=self._sweep_forever, name="attn-session-sweeper", daemon=True)
            self._sweeper.start()

    def _sweep_forever(self) -> None:
        interval = min(0.5, self.idle_s / 4)
        while not self._stop.wait(interval):
            self.sweep()
            self._changed()  # the positions and bytes that steps changed, off the steps' path

    def close(self) -> None:
        """Stop the sweeper and free every cache (the app stops)."""
        self._stop.set()
        with self._lock:
            for session in list(self.sessions.values()):
                self._drop(session, None)
        if self._sweeper is not None:
            self._sweeper.join(timeout=2)

    # -- state ------------------------------------------------------------------------------------------------------

    def totals(self) -> tuple[int, int, int]:
        """(live sessions, cache bytes, positions kept)."""
        with self._lock:
            sessions = list(self.sessions.values())
        return len(sessions), sum(s.lease.held for s in sessions), sum(s.cache.length for s in sessions)

    def _changed(self) -> None:
        if self.observer is not None:
            self.observer.sessions_changed(*self.totals())
