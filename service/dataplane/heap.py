"""The process's heap, kept small: the start-up heap taken out of the garbage collector's walks, and the C heap's
free memory given back to the operating system after requests.

:func:`freeze_startup_heap` (``ATTN_GC_FREEZE``): once the engines have started, every object alive then moves into
the collector's permanent generation, once per process (the heap is the process's: the first app that asks freezes
it).

A :class:`HeapTrimmer`, one per data plane, gives the C heap's free memory back after a request that held a large
body ends, whatever its answer (glibc keeps freed blocks below its mmap threshold, up to 32 MiB each, in the heap:
eight refused 30 MB uploads left a worker at 800 MB), and after any requests once the process has been quiet for a
second (:meth:`HeapTrimmer.release_after`).
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Callable

logger = logging.getLogger("service")

_heap_frozen = threading.Lock()
"""Held for good by the first :func:`freeze_startup_heap` of the process."""


def freeze_startup_heap() -> bool:
    """Collect garbage, then move every tracked object into the permanent generation; once per process.

    A full (generation 2) collection walks every container object alive, and a
    started service holds some 70,000 of them (modules, FastAPI's routes and
    schemas, the engines): about 20 ms of the event loop, seen as a pause by
    every request in flight. After ``gc.freeze`` the collector ignores those
    objects (https://docs.python.org/3/library/gc.html#gc.freeze), so a full
    collection walks only what was created since. Objects alive at the freeze
    that later become cyclic garbage are never freed, hence once per process,
    after start-up. True when this call froze the heap.
    """
    if not _heap_frozen.acquire(blocking=False):
        return False
    gc.collect()
    gc.freeze()
    logger.debug("start-up heap frozen: %d objects", gc.get_freeze_count())
    return True


TRIM_AFTER_BODY_BYTES = 4 << 20
"""A request whose body (on the wire or inflated) reached this size has its freed memory given back when it ends."""
TRIM_INTERVAL_S = 0.25
"""At most one trim per this many seconds (each walks the heap: a few milliseconds of one core). Once a second let a
burst of large messages keep what it freed until the next trim (``python -m bench grpc-edges burst``;
``docs/operations/production.md``)."""
TRIM_IDLE_S = 1.0
"""After this long with no request ending, the free heap that the requests before left is given back."""


def release_free_heap() -> None:
    """Collect garbage, then trim the C heap. A request that ended in an error can leave its body in a reference
    cycle (the exception's traceback holds the frames that hold the body): a collection frees it first (it walks
    only what was allocated since the start-up heap was frozen, ``ATTN_GC_FREEZE``).
    """
    from service.engines.onnx_engine.heap import release_free_heap as malloc_trim  # glibc's; a no-op elsewhere

    gc.collect()
    malloc_trim()


class HeapTrimmer:
    """Runs ``release`` (:func:`release_free_heap`) in a thread of its own: soon when asked (:meth:`request`), at
    most once per ``interval_s``, requests made while one is pending merged into it; and once the process has been
    quiet for ``idle_s`` after requests ended (:meth:`ended`). :meth:`close` stops the thread (the app stops); a
    request that ends later starts it again.

    Under load, glibc keeps the heap's free memory: many requests at once raise its high-water mark, and
    fragmentation keeps most of it from going back (on a 60 s load test RSS rose in steps from 188 to 240
    MiB while the Python objects traced did not grow). Trimming under load stalls the threads that allocate
    meanwhile (one trim took up to 20 ms), so the quiet moment after it is when that memory goes back.
    """

    def __init__(
        self, release: Callable[[], None], interval_s: float = TRIM_INTERVAL_S, idle_s: float = TRIM_IDLE_S
    ) -> None:
        self._release = release
        self._interval_s = interval_s
        self._idle_s = idle_s
        self._wanted = threading.Event()
        self._soon = False
        self._idle_pending = False
        self._last_end = 0.0
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        """Set to end the thread running now (each thread has its own)."""
        self._lock = threading.Lock()
        self.trims = 0

    def release_after(self, nbytes: int) -> None:
        """A request that held ``nbytes`` of body has ended: trim the heap soon when that was large, and in any case
        once the process is quiet (:meth:`ended`).
        """
        if nbytes >= TRIM_AFTER_BODY_BYTES:
            self.request()
        else:
            self.ended()

    def request(self) -> None:
        """Ask for a trim soon (never blocks)."""
        self._soon = True
        self._wake()

    def ended(self) -> None:
        """A request ended: trim once no other one has ended for ``idle_s`` (never blocks; a clock read and a
        flag while one is already pending).
        """
        self._last_end = time.monotonic()
        if not self._idle_pending:
            self._idle_pending = True
            self._wake()

    def close(self) -> None:
        """End the thread, if one runs, without waiting for it (a trim under way finishes first)."""
        with self._lock:
            stop, self._stop, self._thread = self._stop, threading.Event(), None
        stop.set()
        self._wanted.set()
        self._idle_pending = False

    def _wake(self) -> None:
        self._wanted.set()
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, args=(self._stop,), name="heap-trim", daemon=True)
                    self._thread.start()

    def _run(self, stop: threading.Event) -> None:
        last = 0.0
        while True:
            self._wanted.wait()
            if stop.is_set():
                return  # closed: the wake is left set for the thread that may follow
            self._wanted.clear()
            if not self._soon:  # after requests ended: wait for a quiet moment (a request asking meanwhile goes first)
                while not self._soon and (quiet := self._last_end + self._idle_s - time.monotonic()) > 0:
                    self._wanted.wait(quiet)
                    if stop.is_set():
                        return
                    self._wanted.clear()
            pause = last + self._interval_s - time.monotonic()
            if pause > 0 and stop.wait(pause):
                return
            self._wanted.clear()  # what asked during the pause is served by this trim
            self._soon = False
            self._idle_pending = False  # a request ending from here on asks for the next idle trim
            try:
                self._release()
            except Exception:  # never let a trim end the thread
                logger.exception("giving the C heap's free memory back failed")
            self.trims += 1
            last = time.monotonic()
