"""The response head leaves in the same write as the first body chunk, byte for byte what uvicorn sends."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from service.http.edge.cycle import HeadWithBodyCycle


class RecordingTransport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        assert not self.closed, "write after close"
        self.writes.append(bytes(data))

    def writelines(self, chunks: Any) -> None:
        self.write(b"".join(chunks))  # one call: what the transport makes one writev of

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_write_buffer_size(self) -> int:
        return 0

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...


def _run(cls: type[RequestResponseCycle], method: str, messages: list[dict[str, Any]], keep_alive: bool = True):
    transport = RecordingTransport()
    responses: list[int] = []

    async def go() -> None:
        cycle = cls(
            scope={"type": "http", "method": method, "http_version": "1.1", "path": "/", "headers": []},  # type: ignore[arg-type]
            transport=transport,  # type: ignore[arg-type]
            flow=FlowControl(transport),  # type: ignore[arg-type]
            logger=logging.getLogger("test"),
            access_logger=logging.getLogger("test.access"),
            access_log=False,
            default_headers=[],
            message_event=asyncio.Event(),
            expect_100_continue=False,
            keep_alive=keep_alive,
            on_response=lambda: responses.append(len(transport.writes)),
        )
        for message in messages:
            await cycle.send(message)  # type: ignore[arg-type]

    asyncio.run(go())
    return transport, responses


def start(length: int | None) -> dict[str, Any]:
    headers = [(b"content-type", b"application/json")]
    if length is not None:
        headers.append((b"content-length", str(length).encode()))
    return {"type": "http.response.start", "status": 200, "headers": headers}


def body(data: bytes, more: bool = False) -> dict[str, Any]:
    return {"type": "http.response.body", "body": data, "more_body": more}


CASES = {
    "one body": ("GET", [start(9), body(b'{"ok":42}')], True),
    "empty body": ("POST", [start(0), body(b"")], True),
    "streamed, chunked": ("GET", [start(None), body(b"[1,", more=True), body(b"2]", more=True), body(b"")], True),
    "connection close": ("GET", [start(2), body(b"{}")], False),
    "HEAD": ("HEAD", [start(9), body(b"")], True),
    "large body": ("GET", [start(100_000), body(b"x" * 100_000)], True),
}


@pytest.mark.parametrize("case", CASES)
def test_same_bytes_as_uvicorn_head_with_first_chunk(case: str) -> None:
    method, messages, keep_alive = CASES[case]
    ours, our_responses = _run(HeadWithBodyCycle, method, messages, keep_alive)
    theirs, their_responses = _run(RequestResponseCycle, method, messages, keep_alive)
    assert b"".join(ours.writes) == b"".join(theirs.writes)  # the same bytes on the wire
    assert ours.closed == theirs.closed == (not keep_alive)
    assert len(our_responses) == len(their_responses) == 1
    assert our_responses[0] >= 1  # everything was written before the response was declared complete
    if method == "HEAD":
        assert ours.writes == theirs.writes  # not held: uvicorn writes no body for HEAD
    else:
        assert len(ours.writes) == len(theirs.writes) - 1  # head and first chunk in one write
        assert ours.writes[0].startswith(b"HTTP/1.1 200 OK\r\n")
        assert ours.writes[0].endswith(messages[1]["body"] if "content-length" in str(messages[0]) else b"\r\n")
