"""What a gRPC call passes before its message is read: its class's cap, and then its message, read under a
deadline and, for ``ModelInfer``, on the memory budget.

grpc.aio reads a unary call's whole message before its handler runs, with no key checked, no time limit and
nothing counted: 40 half-sent 30 MB messages held 1.3 GB. So the server serves every method as a
client-streaming one (:mod:`service.grpc.service` builds the handlers): the handler runs as soon as the call's
headers are in, and reads the one message itself (:class:`Message`), after the key check and, for
``ModelInfer``, after admission. Until then HTTP/2 flow control holds the message back: with gRPC's adaptive
window (BDP probing) off, a stream buffers at most its initial window (64 KiB) before its message is read, so
a connection's calls (at most ``ATTN_GRPC_MAX_STREAMS_PER_CONNECTION`` are served, the rest refused before
their message is read) hold little before they are admitted.

- **Classes** (:data:`INFERENCE`, :data:`PROBES`, :data:`STREAMS`): inference calls, probes and long-lived
  streams each have a cap of their own (``ATTN_GRPC_MAX_CONCURRENT_RPCS``, ``..._PROBES``, ``..._STREAMS``), so
  a flood of one cannot shut the others out (256 ``Watch`` streams used to refuse every call, health checks
  included).
- **Message deadline**: a ``ModelInfer`` message must arrive within ``ATTN_BODY_TIMEOUT_S``, as a REST body; a
  probe's or a metadata call's (a few bytes) within :data:`SMALL_MESSAGE_TIMEOUT_S`.
- **Memory**: a ``ModelInfer`` message is read only while the largest message (``ATTN_MAX_BODY_BYTES``) is
  reserved on the request bodies' share of the budget, which REST bodies hold too; once in, the reservation
  settles to the message's size. At most ``share / (2 ATTN_MAX_BODY_BYTES)`` messages are read at once (the
  others wait their turn within their deadline), so the messages being read never take more than half the
  share: a burst of tiny gRPC calls cannot leave REST bodies without room. The small messages of
  the other methods are read at most :data:`SMALL_READS` at a time: gRPC caps each at ``ATTN_MAX_BODY_BYTES``,
  so a hostile client can hold at most that many times the limit, for at most a second.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from google.protobuf.message import DecodeError
from grpc import aio

from service.dataplane.errors import Kind, ServiceError, invalid
from service.dataplane.memory import MemoryLease

T = TypeVar("T")

SMALL_MESSAGE_TIMEOUT_S = 1.0
"""How long the message of a probe, a metadata call or a ``Watch`` may take to arrive (it is a few bytes)."""
WATCH_INTERVAL_S = 0.25
"""How often the reads in progress are checked against their deadlines."""
WATCH_IDLE_S = 1.0
"""The watch stops this long after the last deadline it was given (and starts again with the next read)."""
SMALL_READS = 4
"""Small messages read at once: each may be as large as ``ATTN_MAX_BODY_BYTES`` before gRPC refuses it."""


@dataclass(frozen=True)
class CallClass:
    """A class of calls with a cap of its own."""

    name: str
    setting: str
    """The setting of its cap."""


INFERENCE = CallClass("inference", "ATTN_GRPC_MAX_CONCURRENT_RPCS")
PROBES = CallClass("probes", "ATTN_GRPC_MAX_CONCURRENT_PROBES")
STREAMS = CallClass("streams", "ATTN_GRPC_MAX_CONCURRENT_STREAMS")


class Caps:
    """The calls in flight of each class, each class within its cap (0: no cap), and of each connection within
    ``per_connection`` (HTTP/2's own SETTINGS_MAX_CONCURRENT_STREAMS is not used: gRPC's clients do not wait for
    it, and a stream past it ends UNAVAILABLE "Stream removed", with no retry-after).
    """

    def __init__(self, caps: dict[CallClass, int], per_connection: int) -> None:
        self.caps = caps
        self.per_connection = per_connection
        self.open = dict.fromkeys(caps, 0)
        self.connections: dict[str, int] = {}

    @contextlib.contextmanager
    def slot(self, cls: CallClass, peer: str, retry_after_s: int) -> Iterator[None]:
        """Hold one of the class's places and one of the connection's (``peer``: its address) for the call;
        ``TOO_LARGE`` (RESOURCE_EXHAUSTED, with ``retry_after_s``) when either has none.
        """
        cap = self.caps[cls]
        if cap and self.open[cls] >= cap:
            raise full(
                f"the server already serves its limit of {cap} {cls.name} calls at once ({cls.setting})", retry_after_s
            )
        on_connection = self.connections.get(peer, 0)
        if on_connection >= self.per_connection:
            raise full(
                f"this connection already has its limit of {self.per_connection} calls open at once "
                "(ATTN_GRPC_MAX_STREAMS_PER_CONNECTION)",
                retry_after_s,
            )
        self.open[cls] += 1
        self.connections[peer] = on_connection + 1
        try:
            yield
        finally:
            self.open[cls] -= 1
            left = self.connections[peer] - 1
            if left:
                self.connections[peer] = left
            else:
                del self.connections[peer]


class AtCap(ServiceError):
    """A call refused at a cap (RESOURCE_EXHAUSTED, with a retry-after)."""


def full(what: str, retry_after_s: int) -> AtCap:
    """A refusal at a cap: RESOURCE_EXHAUSTED with a retry-after."""
    return AtCap(Kind.TOO_LARGE, f"{what}; retry after {retry_after_s} s", retry_after_s=retry_after_s)


class Reading:
    """Where messages are read: the gates that bound how many are read at once, their limits, and the watch
    that ends a read past its deadline.

    The deadline is kept by one task that looks at the reads in progress every :data:`WATCH_INTERVAL_S` (and
    stops a second after the last deadline it was given), not by a timer per read: ``asyncio.timeout`` around
    each read cost a tiny call 0.04 ms (measured with a bare grpc.aio server), where a dictionary entry costs
    about a microsecond. A late read ends up to :data:`WATCH_INTERVAL_S` after its deadline.
    """

    def __init__(self, *, max_bytes: int, share_bytes: int, timeout_s: float) -> None:
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s
        self.large = asyncio.Semaphore(max(1, share_bytes // (2 * max_bytes)))
        self.small = asyncio.Semaphore(SMALL_READS)
        self.reads: dict[asyncio.Task[Any], float] = {}
        """The tasks reading a message, with their deadlines (``loop.time()``)."""
        self.late: set[asyncio.Task[Any]] = set()
        """Those the watch cancelled."""
        self._watch: asyncio.Task[None] | None = None
        self._last_deadline = 0.0

    def watch(self, task: asyncio.Task[Any], deadline: float) -> None:
        """End ``task``'s read (cancel it, marked late) if it is still reading at ``deadline``."""
        self.reads[task] = deadline
        self._last_deadline = max(self._last_deadline, deadline)
        if self._watch is None:
            self._watch = asyncio.get_running_loop().create_task(self._run(), name="grpc-message-deadlines")

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self.reads or loop.time() < self._last_deadline + WATCH_IDLE_S:
                await asyncio.sleep(WATCH_INTERVAL_S)
                now = loop.time()
                for task, deadline in list(self.reads.items()):
                    if now >= deadline and task not in self.late:
                        self.late.add(task)
                        task.cancel()
        finally:
            self._watch = None

    async def stop(self) -> None:
        """Stop the watch (the server stops)."""
        watch, self._watch = self._watch, None
        if watch is not None:
            watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watch


class MessageTimeout(ServiceError):
    """The message did not arrive in time."""


class EndOfMessages(ServiceError):
    """The client half-closed the call before a message it had to send."""


class Message(Generic[T]):
    """The one request message of a call, read when its handler asks (:meth:`read`)."""

    __slots__ = ("context", "nbytes", "parse", "reading", "value")

    def __init__(self, context: aio.ServicerContext, parse: Callable[[bytes], T], reading: Reading) -> None:
        self.context = context
        self.parse = parse
        self.reading = reading
        self.value: T | None = None
        self.nbytes = 0

    async def next(self) -> T | None:
        """The next message of a client-streaming call (a small one), or None once the client has sent its last."""
        try:
            return await self.read()
        except EndOfMessages:
            return None

    async def read(self, lease: MemoryLease | None = None) -> T:
        """The message, parsed. With ``lease`` (``ModelInfer``): read while the lease holds the largest message
        may be, then hold its size; within ``ATTN_BODY_TIMEOUT_S``. Without: a small message, within
        :data:`SMALL_MESSAGE_TIMEOUT_S`. ``UNAVAILABLE`` when the bodies' share has no room, ``DEADLINE_EXCEEDED``
        when the message is late, ``INVALID_ARGUMENT`` when it is not the method's message.
        """
        reading = self.reading
        timeout_s = reading.timeout_s if lease is not None else min(reading.timeout_s, SMALL_MESSAGE_TIMEOUT_S)
        gate = reading.large if lease is not None else reading.small
        task = asyncio.current_task()
        assert task is not None  # a handler runs in a task of its own
        reading.watch(task, asyncio.get_running_loop().time() + timeout_s)
        try:
            async with gate:
                if lease is not None:
                    lease.reserve(reading.max_bytes)  # UNAVAILABLE at once when the share has no room
                raw = await self.context.read()
        except asyncio.CancelledError:
            if task not in reading.late:
                raise  # the client went away, or the shutdown grace ended
            task.uncancel()
            setting = "ATTN_BODY_TIMEOUT_S" if lease is not None else "the probes' and metadata calls' one second"
            raise MessageTimeout(
                Kind.TIMEOUT,
                f"the request message did not arrive within {timeout_s:g} s ({setting}); send it at once after "
                "the call's headers",
            ) from None
        finally:
            reading.reads.pop(task, None)
            reading.late.discard(task)
        if not isinstance(raw, bytes):  # aio.EOF: the client half-closed without a message
            raise EndOfMessages(Kind.INVALID, "the call ended without its request message")
        self.nbytes = len(raw)
        if lease is not None:
            lease.settle(self.nbytes)
        try:
            value = self.parse(raw)
        except DecodeError:
            raise invalid("the request is not a valid protobuf message of this method", "message") from None
        self.value = value
        return value
