"""How a response is written to the socket: uvicorn's response cycle with the head sent together with the
first body chunk, and the end of an answer whose request body is still arriving turned into a lingering
close (used by :class:`service.http.edge.protocol.BoundedHttpToolsProtocol`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

COALESCE_MAX_BYTES = 64 << 10
"""Body chunks up to this size are copied behind the head (one buffer); larger ones are written beside it."""


class HeldWrites:
    """Stands in for the transport while uvicorn writes a response head: keeps the bytes."""

    __slots__ = ("data",)

    def __init__(self) -> None:
        self.data = b""

    def write(self, data: bytes) -> None:
        self.data += data


class PrefixedTransport:
    """The transport, with ``head`` sent in front of the first write (the rest passes through)."""

    __slots__ = ("head", "transport")

    def __init__(self, transport: Any, head: bytes) -> None:
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


class LingerOnClose:
    """The transport, whose ``close`` (uvicorn's at the end of a ``Connection: close`` answer) begins a
    lingering close instead: the request's body has not all arrived.
    """

    __slots__ = ("linger", "transport")

    def __init__(self, transport: Any, linger: Callable[[], None]) -> None:
        self.transport = transport
        self.linger = linger

    def close(self) -> None:
        self.linger()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)


class HeadWithBodyCycle(RequestResponseCycle):
    """uvicorn's response cycle, writing the response head with the first body chunk (one ``send``), and
    closing a connection whose request body is still arriving the lingering way.

    The head is built by uvicorn as before (same checks, same bytes) but kept until the first
    ``http.response.body`` message, whose bytes (possibly none) follow it in one write. Answers to
    HEAD (uvicorn writes no body for them) and a ``100 Continue`` (written from ``receive``) are
    not held. With ``linger`` set (by :class:`BoundedHttpToolsProtocol`), an answer that starts
    before the request's body has arrived in full is sent with ``Connection: close``, and its end
    calls ``linger`` instead of closing the transport.
    """

    _head: bytes | None = None
    linger: Callable[[], None] | None = None

    async def send(self, message: Any) -> None:
        kind = message["type"]
        if kind == "http.response.start" and not self.response_started:
            if self.linger is not None and self.more_body:
                self.keep_alive = False  # the body will not be read: uvicorn adds `connection: close`
            if self.scope["method"] == "HEAD":
                await super().send(message)
                return
            transport, held = self.transport, HeldWrites()
            self.transport = held  # type: ignore[assignment]  # only write() is called while the head is built
            try:
                await super().send(message)
            finally:
                self.transport = transport
            self._head = held.data or None
            return
        body = kind == "http.response.body"
        head = self._head if body else None
        linger = self.linger
        if linger is not None and not (
            body and self.more_body and not self.keep_alive and not message.get("more_body", False)
        ):
            linger = None  # not the end of an answer whose request body is still arriving
        if head is None and linger is None:
            await super().send(message)
            return
        transport = self.transport
        target: Any = transport if linger is None else LingerOnClose(transport, linger)
        prefixed = None
        if head is not None:
            self._head = None
            target = prefixed = PrefixedTransport(target, head)
        self.transport = target
        try:
            await super().send(message)
        finally:
            self.transport = transport
        if prefixed is not None and prefixed.head is not None and not self.disconnected and not transport.is_closing():
            transport.write(prefixed.head)  # uvicorn wrote nothing (it refused the message): the head still goes
