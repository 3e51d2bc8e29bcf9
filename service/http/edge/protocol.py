"""The HTTP/1.1 connection limits uvicorn's httptools protocol lacks: header size and time, send timeout.

``python -m service serve`` runs uvicorn with ``http=`` this protocol (uvloop
and httptools, as before). uvicorn (0.54) bounds a connection only by
``timeout_keep_alive`` (idle time *after* an answer: used for
``ATTN_KEEP_ALIVE_TIMEOUT_S``); with httptools it has no limit on the size of
the headers (``h11_max_incomplete_event_size`` exists for its h11 protocol
only, which is several times slower), no time limit on a connection that
sends nothing or trickles its headers, and no limit on how long a client may
leave its answer unread (the answer stays in the transport's buffer as long
as the client keeps the connection open). So this subclass adds:

- **431** when the request line and headers pass ``ATTN_MAX_HEADER_BYTES``
  (counted as they arrive, before the parser buffers them), then closes;
- **header timeout**: a connection must send a request's complete headers
  within ``ATTN_HEADER_TIMEOUT_S`` of opening (or of the request's first byte,
  on a kept-alive connection), else it is closed;
- **send timeout**: while writing is paused (the transport's buffer is above
  its high-water mark), a client that takes no byte of its answer for
  ``ATTN_SEND_TIMEOUT_S`` is disconnected (abort: the buffered answer is
  freed); a client reading slowly keeps its connection.

Body time limits (408) are the middleware's (:mod:`service.http.edge.layer`),
since the app is the one waiting for the body.

It also sends a response's head (status line and headers) in the same write
as the first body chunk (:class:`HeadWithBodyCycle`): uvicorn writes them
separately, two ``send`` calls and two TCP segments for an answer that fits in
one, which cost a tiny request about 20 us end to end (measured with wrk).
"""

from __future__ import annotations

import asyncio
import functools
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from service.http.errors import PROBLEM_MEDIA_TYPE, PROBLEM_TYPE_BASE


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    max_header_bytes: int
    header_timeout_s: float
    send_timeout_s: float


@functools.cache
def connection_limits() -> ConnectionLimits:
    """The limits of this process, from the ``ATTN_*`` environment (read once per worker)."""
    from service.settings import Settings

    s = Settings()
    return ConnectionLimits(s.max_header_bytes, s.header_timeout_s, s.send_timeout_s)


def _response_431(limit: int) -> bytes:
    body = (
        '{"type":"' + PROBLEM_TYPE_BASE + 'headers-too-large","title":"Request header fields too large",'
        '"status":431,"detail":"the request line and headers are larger than the limit of ' + str(limit) + ' bytes"}'
    ).encode()
    return (
        b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: "
        + PROBLEM_MEDIA_TYPE.encode()
        + b"\r\ncontent-length: "
        + str(len(body)).encode()
        + b"\r\nconnection: close\r\n\r\n"
        + body
    )


COALESCE_MAX_BYTES = 64 << 10
"""Body chunks up to this size are copied behind the head (one buffer); larger ones are written beside it."""


class _HeldWrites:
    """Stands in for the transport while uvicorn writes a response head: keeps the bytes."""

    __slots__ = ("data",)

    def __init__(self) -> None:
        self.data = b""

    def write(self, data: bytes) -> None:
        self.data += data


class _PrefixedTransport:
    """The transport, with ``head`` sent in front of the first write (the rest passes through)."""

    __slots__ = ("head", "transport")

    def __init__(self, transport: asyncio.Transport, head: bytes) -> None:
        self.transport = transport
        self.head: bytes | None = head

    def write(self, data: bytes) -> None:
        head = self.head
        if head is None:
            self.transport.write(data)
            return
        self.head = None
        if len(data) <= COALESCE_MAX_BYTES:
            self.transport.write(head + data)
        else:  # no copy of a large body: uvloop writes the two buffers in one writev
            self.transport.writelines((head, data))

    def close(self) -> None:
        if self.head is not None:
            self.write(b"")
        self.transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)


class HeadWithBodyCycle(RequestResponseCycle):
    """uvicorn's response cycle, writing the response head with the first body chunk (one ``send``).

    The head is built by uvicorn as before (same checks, same bytes) but kept until the first
    ``http.response.body`` message, whose bytes (possibly none) follow it in one write. Answers to
    HEAD (uvicorn writes no body for them) and a ``100 Continue`` (written from ``receive``) are
    not held.
    """

    _head: bytes | None = None

    async def send(self, message: Any) -> None:
        starting = message["type"] == "http.response.start" and not self.response_started
        if starting and self.scope["method"] != "HEAD":
            transport, held = self.transport, _HeldWrites()
            self.transport = held  # type: ignore[assignment]  # only write() is called while the head is built
            try:
                await super().send(message)
            finally:
                self.transport = transport
            self._head = held.data or None
            return
        head = self._head
        if head is None or message["type"] != "http.response.body":
            await super().send(message)
            return
        self._head = None
        transport, prefixed = self.transport, _PrefixedTransport(self.transport, head)
        self.transport = prefixed  # type: ignore[assignment]  # a transport in all but its head
        try:
            await super().send(message)
        finally:
            self.transport = transport
        if prefixed.head is not None and not self.disconnected and not transport.is_closing():
            transport.write(head)  # uvicorn wrote nothing (it refused the message): the head still goes


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with header-size, header-time and send-time limits (module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        limits = connection_limits()
        self._max_header_bytes = limits.max_header_bytes
        self._header_timeout_s = limits.header_timeout_s
        self._send_timeout_s = limits.send_timeout_s
        self._in_headers = True
        self._header_bytes = 0
        self._header_timer: asyncio.TimerHandle | None = None
        self._send_timer: asyncio.TimerHandle | None = None
        self._buffered = 0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timers()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._in_headers and not self.transport.is_closing():
            self._header_bytes += len(data)
            if self._header_bytes > self._max_header_bytes:
                self.transport.write(_response_431(self._max_header_bytes))
                self.transport.close()
                self._cancel_timers()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_headers = True
        self._header_bytes = 0
        if self._header_timer is None:  # the next request on a kept-alive connection
            self._arm_header_timer()

    def on_headers_complete(self) -> None:
        self._in_headers = False
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
        super().on_headers_complete()
        if type(self.cycle) is RequestResponseCycle:  # the app's task has not run yet: its send is ours
            self.cycle.__class__ = HeadWithBodyCycle

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._send_timer is None:
            self._buffered = self.transport.get_write_buffer_size()
            self._send_timer = self.loop.call_later(self._send_timeout_s, self._on_send_timeout)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None

    def _arm_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
        self._header_timer = self.loop.call_later(self._header_timeout_s, self._on_header_timeout)

    def _on_header_timeout(self) -> None:
        self._header_timer = None
        if self._in_headers and not self.transport.is_closing():
            self.transport.close()

    def _on_send_timeout(self) -> None:
        """No byte of the answer was taken by the client for the send timeout: drop the connection and
        what it buffered. A client that reads, however slowly, keeps its connection.
        """
        buffered = self.transport.get_write_buffer_size()
        if buffered < self._buffered:
            self._buffered = buffered
            self._send_timer = self.loop.call_later(self._send_timeout_s, self._on_send_timeout)
            return
        self._send_timer = None
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.disconnected = True
        self.transport.abort()

    def _cancel_timers(self) -> None:
        for timer in (self._header_timer, self._send_timer):
            if timer is not None:
                timer.cancel()
        self._header_timer = self._send_timer = None
