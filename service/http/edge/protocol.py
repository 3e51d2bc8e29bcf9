"""The HTTP/1.1 connection limits uvicorn's httptools protocol lacks: header size and time, send timeout,
lingering close of unread bodies, and a cap on open connections.

``python -m service serve`` runs uvicorn with ``http=`` this protocol (uvloop
and httptools, as before). uvicorn (0.54) bounds a connection only by
``timeout_keep_alive`` (idle time *after* an answer: used for
``ATTN_KEEP_ALIVE_TIMEOUT_S``); with httptools it has no limit on the size of
the headers (``h11_max_incomplete_event_size`` exists for its h11 protocol
only, which is several times slower), no time limit on a connection that
sends nothing or trickles its headers, no limit on how long a client may
leave its answer unread (the answer stays in the transport's buffer as long
as the client keeps the connection open), nothing for a body that keeps
arriving after its answer was sent (the keep-alive timer is cancelled by each
byte and re-armed only when a response completes: such a connection stayed
open for good, and one streaming at full speed kept the parser busy), and no
cap on connections (past the file descriptor limit, accepting fails for
everyone, probes included). So this subclass adds:

- **431** when the request line and headers pass ``ATTN_MAX_HEADER_BYTES``: the
  bytes of an unfinished header block are counted as they arrive, before the
  parser sees them, and a finished one is measured header by header as it is
  parsed (so a whole request in one segment is held to the limit too); then
  the connection closes;
- **header timeout**: a connection must send a request's complete headers
  within ``ATTN_HEADER_TIMEOUT_S`` of opening (or of the request's first byte,
  on a kept-alive connection), else it is closed;
- **send timeout**: while writing is paused (the transport's buffer is above
  its high-water mark), a client that takes no byte of its answer for
  ``ATTN_SEND_TIMEOUT_S`` is disconnected (abort: the buffered answer is
  freed); a client reading slowly keeps its connection;
- **lingering close** (nginx's ``lingering_close``): an answer that starts
  before the request's body has arrived in full carries ``Connection: close``;
  once it is written the server shuts down its side of the connection and
  reads and discards the rest of the body (unparsed) for at most
  ``ATTN_LINGER_TIME_S`` in all, ``ATTN_LINGER_TIMEOUT_S`` without a byte, and
  ``ATTN_LINGER_MAX_BYTES``, then closes. A client that is still sending when
  its answer comes (a 503 at admission, a 401, a 413) reads the answer instead
  of a reset, and no such connection stays open;
- **a cap on open connections** (``ATTN_MAX_CONNECTIONS`` per worker, lowered
  to what ``RLIMIT_NOFILE`` leaves): a connection past it is answered at once
  with a 503 (``Retry-After``, ``Connection: close``) and closed the same
  lingering way, so the process keeps the descriptors that its probes and its
  clients within the cap need.

Body time limits (408) are the middleware's (:mod:`service.http.edge.layer`),
since the app is the one waiting for the body.

It also sends a response's head (status line and headers) in the same write
as the first body chunk (:class:`HeadWithBodyCycle`): uvicorn writes them
separately, two ``send`` calls and two TCP segments for an answer that fits in
one, which cost a tiny request about 20 us end to end (measured with wrk).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from service.http.edge.connections import (
    FD_RESERVE,
    connection_limits,
    response_431,
    response_503_connections,
)
from service.http.edge.cycle import HeadWithBodyCycle

logger = logging.getLogger("service.limits")

REQUEST_LINE_OVERHEAD = 16
"""Bytes of a request line beside its target (method, version, spaces, CRLF), counted with the target."""
HEADER_OVERHEAD = 4
"""Bytes of a header line beside its name and value (``": "`` and CRLF)."""
REFUSAL_LOG_INTERVAL_S = 10.0
"""At most one warning line per this many seconds about refused connections (with the count)."""


class _HeadersTooLarge(Exception):
    """Raised from a parser callback once a parsed header block passes the limit."""


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with header-size, header-time and send-time limits, lingering close and a
    cap on connections (module docstring).
    """

    refused_connections = 0
    """Connections refused by this process for the cap (all instances)."""
    _last_refusal_log = 0.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        limits = self._limits = connection_limits()
        self._max_header_bytes = limits.max_header_bytes
        self._header_timeout_s = limits.header_timeout_s
        self._send_timeout_s = limits.send_timeout_s
        self._in_headers = True
        self._header_bytes = 0
        self._parsed_header_bytes = 0
        self._headers_too_large = False
        self._tail = b""
        self._header_timer: asyncio.TimerHandle | None = None
        self._send_timer: asyncio.TimerHandle | None = None
        self._buffered = 0
        self._lingering = False
        self._refuse_after_response = False
        self._linger_timer: asyncio.TimerHandle | None = None
        self._linger_end = 0.0
        self._linger_last = 0.0
        self._linger_left = 0

    # -- connection ------------------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self._limits.max_connections:
            self._refuse_connection()
            return
        self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timers()
        super().connection_lost(exc)

    def _refuse_connection(self) -> None:
        cls = BoundedHttpToolsProtocol
        cls.refused_connections += 1
        now = time.monotonic()
        if now - cls._last_refusal_log >= REFUSAL_LOG_INTERVAL_S:
            cls._last_refusal_log = now
            logger.warning(
                "refusing connections: %d open, the limit of this process (ATTN_MAX_CONNECTIONS, at most "
                "RLIMIT_NOFILE - %d); %d refused so far",
                len(self.connections) - 1,
                FD_RESERVE,
                cls.refused_connections,
            )
        refused = self.app_state.get("attn.connection_refused")
        if callable(refused):
            refused()
        self._in_headers = False
        self.transport.write(response_503_connections(self._limits.max_connections))
        self._linger()

    # -- reading -----------------------------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self._lingering:
            self._discard(len(data))
            return
        if self._refuse_after_response:  # the parser stopped; reading is paused until the answer is out
            return
        if self._in_headers and not self.transport.is_closing():
            # Counted before the parser sees them: up to the end of the header block when it is in this segment.
            tail = self._tail
            end = data.find(b"\r\n\r\n")
            counted = len(data) if end < 0 else end + 4
            if tail:  # a terminator split between the last segment and this one
                split = (tail + data[:3]).find(b"\r\n\r\n")
                if split >= 0:
                    counted = split + 4 - len(tail)
            self._header_bytes += counted
            if self._header_bytes > self._max_header_bytes:
                self._refuse_headers()
                return
            self._tail = (tail + data[-3:])[-3:]
        super().data_received(data)

    def send_400_response(self, msg: str) -> None:
        if self._headers_too_large:  # the parser stopped at our callback: the block is over the limit
            self._refuse_headers()
            return
        super().send_400_response(msg)

    def _refuse_headers(self) -> None:
        """431, then the lingering close: a client still sending its headers reads the answer, not a reset. Behind
        a pipelined request still being answered, the 431 follows that answer.
        """
        self._in_headers = False
        self._cancel_timers()
        if self.cycle is not None and not self.cycle.response_complete:
            self._refuse_after_response = True
            self.flow.pause_reading()
            return
        self.transport.write(response_431(self._max_header_bytes))
        self._linger()

    def _count_parsed(self, nbytes: int) -> None:
        self._parsed_header_bytes += nbytes
        if self._parsed_header_bytes > self._max_header_bytes:
            self._headers_too_large = True
            raise _HeadersTooLarge  # stops the parser: httptools raises HttpParserCallbackError

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_headers = True
        self._parsed_header_bytes = REQUEST_LINE_OVERHEAD
        if self._header_timer is None:  # the next request on a kept-alive connection
            self._arm_header_timer()

    def on_url(self, url: bytes) -> None:
        super().on_url(url)
        self._count_parsed(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        super().on_header(name, value)
        self._count_parsed(len(name) + len(value) + HEADER_OVERHEAD)

    def on_headers_complete(self) -> None:
        self._in_headers = False
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
        super().on_headers_complete()
        if type(self.cycle) is RequestResponseCycle:  # the app's task has not run yet: its send is ours
            self.cycle.__class__ = HeadWithBodyCycle
            self.cycle.linger = self._linger  # type: ignore[attr-defined]

    def on_message_complete(self) -> None:
        super().on_message_complete()
        # What follows is the next request's header block: counted from its first byte.
        self._in_headers = True
        self._header_bytes = 0
        self._tail = b""

    def on_response_complete(self) -> None:
        if self._lingering:  # no keep-alive and no pipelined request: the connection is being closed
            self.server_state.total_requests += 1
            return
        if self._refuse_after_response:  # the header block after this answer was too large
            self.server_state.total_requests += 1
            self._refuse_after_response = False
            if not self.transport.is_closing():
                self.transport.write(response_431(self._max_header_bytes))
                self._linger()
            return
        super().on_response_complete()

    # -- lingering close ---------------------------------------------------------------------------------------

    def _linger(self) -> None:
        """Shut down our side once the answer is out, then read and discard what the client still sends, within
        the linger bounds, and close.
        """
        transport = self.transport
        if self._lingering or transport.is_closing():
            return
        self._lingering = True
        self._in_headers = False
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
        self._unset_keepalive_if_required()
        limits = self._limits
        now = self.loop.time()
        self._linger_end = now + limits.linger_time_s
        self._linger_last = now
        self._linger_left = limits.linger_max_bytes
        try:
            if transport.can_write_eof():
                transport.write_eof()  # FIN after the answer: the client sees it complete
        except (OSError, RuntimeError):
            transport.close()
            return
        self.flow.resume_reading()
        self._linger_timer = self.loop.call_later(limits.linger_timeout_s, self._on_linger_timer)

    def _discard(self, nbytes: int) -> None:
        self._linger_left -= nbytes
        self._linger_last = self.loop.time()
        if self._linger_left < 0:
            self._end_linger()

    def _on_linger_timer(self) -> None:
        self._linger_timer = None
        now = self.loop.time()
        quiet_until = self._linger_last + self._limits.linger_timeout_s
        if now >= self._linger_end or now >= quiet_until:
            self._end_linger()
            return
        self._linger_timer = self.loop.call_later(min(quiet_until, self._linger_end) - now, self._on_linger_timer)

    def _end_linger(self) -> None:
        if self._linger_timer is not None:
            self._linger_timer.cancel()
            self._linger_timer = None
        if not self.transport.is_closing():
            self.transport.close()

    # -- writing -----------------------------------------------------------------------------------------------

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

    # -- timers ------------------------------------------------------------------------------------------------

    def _arm_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
        self._header_timer = self.loop.call_later(self._header_timeout_s, self._on_header_timeout)

    def _on_header_timeout(self) -> None:
        self._header_timer = None
        if self._in_headers and not self.transport.is_closing() and not self._lingering:
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
        for timer in (self._header_timer, self._send_timer, self._linger_timer):
            if timer is not None:
                timer.cancel()
        self._header_timer = self._send_timer = self._linger_timer = None
