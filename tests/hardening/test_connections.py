"""Connections on a live ``python -m service serve`` (issue 21, items 7 and 11): an answer sent with the body unread
closes the connection the lingering way (bounded in time and bytes, and readable by a client still sending),
a cap on open connections with a clear refusal, and the header limit held whatever the segmentation.
"""

from __future__ import annotations

import asyncio
import base64
import os
import socket
import time
from typing import Any

import httpx
import numpy as np
import orjson
import pytest

from tests.hardening.conftest import metric_value
from tests.hardening.test_serve_limits import closed_by_server, connect, read_response, request_head

pytestmark = pytest.mark.slow  # each test starts a live server


def server_cpu_s(pid: int) -> float:
    """User plus system CPU seconds of process ``pid`` (Linux)."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rpartition(b")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_a_body_sent_after_its_answer_is_drained_then_the_connection_closes(live_server) -> None:  # type: ignore[no-untyped-def]
    """``POST /nope`` with a 1 MB Content-Length, the 404 read, one byte, then nothing: closed after the linger
    timeout (it stayed open for good: the byte cancelled the keep-alive timer).
    """
    server = live_server({"ATTN_LINGER_TIMEOUT_S": "1", "ATTN_KEEP_ALIVE_TIMEOUT_S": "1"})
    sock = connect(server)
    sock.sendall(request_head("/nope", 1_000_000))
    status, headers, _ = read_response(sock)
    assert status == 404 and headers["connection"] == "close"
    sock.sendall(b"x")
    t0 = time.monotonic()
    assert closed_by_server(sock, 10)
    assert time.monotonic() - t0 < 5
    sock.close()


def test_full_speed_upload_after_a_401_is_cut_off_cheaply(live_server) -> None:  # type: ignore[no-untyped-def]
    key = "k" * 32
    server = live_server({"ATTN_API_KEYS": key, "ATTN_LINGER_MAX_BYTES": str(8 << 20), "ATTN_LINGER_TIME_S": "3"})
    cpu0 = server_cpu_s(server.proc.pid)
    sock = connect(server)
    sock.sendall(request_head("/v1/attention", 1 << 40))  # a terabyte declared, no key
    status, headers, _ = read_response(sock)
    assert status == 401 and headers["connection"] == "close"
    chunk = b" " * (1 << 20)
    sent = 0
    t0 = time.monotonic()
    try:
        while time.monotonic() - t0 < 15:
            sock.sendall(chunk)
            sent += len(chunk)
    except (BrokenPipeError, ConnectionResetError):
        pass
    elapsed = time.monotonic() - t0
    sock.close()
    assert elapsed < 10, f"still accepting after {sent >> 20} MiB"
    assert sent < 64 << 20  # 8 MiB discarded, then closed (plus what the socket buffers held)
    assert server_cpu_s(server.proc.pid) - cpu0 < 2.0


def test_refusals_at_the_headers_are_read_not_reset(live_server) -> None:  # type: ignore[no-untyped-def]
    """128 concurrent 2 MB requests over 64 connections: the refused ones read their 503 (the server drained the
    body it did not want), none sees the connection reset while it was still sending.
    """
    server = live_server(
        {"ATTN_MAX_QUEUED_REQUESTS": "4", "ATTN_DEBUG_DELAY_S": "0.3", "ATTN_MEMORY_BUDGET_BYTES": str(2 << 30)}
    )
    rng = np.random.default_rng(0)
    kv = rng.standard_normal((1, 1, 1024, 256)).astype("<f4")
    b64 = {"shape": list(kv.shape), "dtype": "float32", "b64": base64.b64encode(kv.tobytes()).decode()}
    q = {"shape": [1, 1, 1, 256], "dtype": "float32", "b64": base64.b64encode(kv[:, :, :1].tobytes()).decode()}
    body = orjson.dumps({"query": q, "key": b64, "value": b64, "return": ["output"]})
    assert len(body) > 2_000_000

    async def run() -> list[Any]:
        limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
        async with httpx.AsyncClient(limits=limits, timeout=60) as client:

            async def one() -> Any:
                try:
                    r = await client.post(server.url + "/v1/attention", content=body)
                    return r.status_code
                except httpx.TransportError as exc:
                    return repr(exc)

            return await asyncio.gather(*(one() for _ in range(128)))

    outcomes = asyncio.run(run())
    errors = [o for o in outcomes if not isinstance(o, int)]
    assert not errors, errors[:5]
    assert set(outcomes) <= {200, 503} and 503 in outcomes and 200 in outcomes, outcomes


def test_connections_past_the_cap_get_a_clear_503(live_server) -> None:  # type: ignore[no-untyped-def]
    server = live_server({"ATTN_MAX_CONNECTIONS": "8"})
    holders = [connect(server) for _ in range(8)]
    time.sleep(0.3)
    extra = connect(server)
    extra.sendall(b"GET /healthz HTTP/1.1\r\nhost: test\r\n\r\n")
    status, headers, body = read_response(extra)
    assert status == 503 and headers["connection"] == "close" and headers["retry-after"] == "1"
    problem = orjson.loads(body)
    assert problem["status"] == 503 and "ATTN_MAX_CONNECTIONS" in problem["detail"]
    assert closed_by_server(extra, 10)
    extra.close()
    for sock in holders:
        sock.close()
    time.sleep(0.3)
    assert httpx.get(server.url + "/healthz").status_code == 200
    text = httpx.get(server.url + "/metrics").text
    assert metric_value(text, "attn_http_requests_rejected_total", reason="connections") >= 1


def test_holders_of_unread_bodies_cannot_exhaust_descriptors(live_server) -> None:  # type: ignore[no-untyped-def]
    """RLIMIT_NOFILE 256 and 300 connections that each read a 404 and then hold their body back: the server refuses
    what it cannot hold, closes the holders after the linger timeout, and /healthz answers again.
    """
    server = live_server({"ATTN_LINGER_TIMEOUT_S": "1"}, nofile=256)
    socks: list[socket.socket] = []
    for _ in range(300):
        try:
            sock = connect(server)
            sock.sendall(request_head("/nope", 1_000_000))
            read_response(sock)
            sock.sendall(b"x")
        except (ConnectionResetError, BrokenPipeError, AssertionError, OSError):
            pass
        socks.append(sock)
    time.sleep(3)  # the linger timeout, and some
    r = httpx.get(server.url + "/healthz", timeout=5)
    assert r.status_code == 200
    still_open = sum(not closed_by_server(s, 0.2) for s in socks)
    assert still_open == 0
    for s in socks:
        s.close()


@pytest.mark.parametrize("filler", [20_000, 60_000])
def test_headers_in_one_segment_are_held_to_the_limit(live_server, filler: int) -> None:  # type: ignore[no-untyped-def]
    """16 KiB of headers is the limit, also when the whole request arrives in one read (64 KB was accepted)."""
    server = live_server()
    sock = connect(server)
    sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: test\r\nx-filler: " + b"a" * filler + b"\r\n\r\n")
    status, headers, body = read_response(sock)
    assert status == 431 and headers["connection"] == "close", body
    assert closed_by_server(sock, 10)
    sock.close()
    sock = connect(server)  # a pipelined pair: the second one's block is measured too
    small = b"GET /healthz HTTP/1.1\r\nhost: test\r\n\r\n"
    sock.sendall(small + b"GET /healthz HTTP/1.1\r\nhost: test\r\nx-filler: " + b"a" * filler + b"\r\n\r\n")
    assert read_response(sock)[0] == 200
    status, _, _ = read_response(sock)
    assert status == 431
    sock.close()
    assert httpx.get(server.url + "/healthz", headers={"x-filler": "a" * 12_000}).status_code == 200
