"""Each connection and admission limit provoked on a live ``python -m service serve`` (raw sockets where the
client must misbehave): slow body (408), big headers (431), silent and idle connections closed, a client
that stops reading disconnected, refusal at the headers (503 + Connection: close, body never read),
costly small bodies kept off the event loop, and a client gone mid-upload logged as 499.
"""

from __future__ import annotations

import base64
import socket
import threading
import time
import weakref
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import pytest

from tests.hardening.conftest import ATTENTION, metric_value, wait_admitted

pytestmark = pytest.mark.slow  # each test starts a live server


def connect(server: Any) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    return sock


_UNREAD: weakref.WeakKeyDictionary[socket.socket, bytes] = weakref.WeakKeyDictionary()
"""Bytes read past a response (the start of the next one, when pipelined answers arrive in one segment)."""


def read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 response with a Content-Length (what the service sends); what follows it is kept for the
    next call on the same socket.
    """
    data = _UNREAD.pop(sock, b"")
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise AssertionError(f"connection closed before a response: {data!r}")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    if len(body) > length:
        _UNREAD[sock] = body[length:]
    return status, headers, body[:length]


def closed_by_server(sock: socket.socket, within_s: float) -> bool:
    """True when the server closes the connection (EOF or reset) within ``within_s``."""
    sock.settimeout(within_s)
    try:
        while True:
            if not sock.recv(65536):
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


def request_head(path: str, length: int, extra: str = "") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\ncontent-length: {length}\r\n"
        f"{extra}\r\n"
    ).encode()


def test_slow_body_is_408_and_closes_the_connection(live_server) -> None:  # type: ignore[no-untyped-def]
    server = live_server({"ATTN_BODY_TIMEOUT_S": "1", "ATTN_MIN_UPLOAD_BYTES_PER_S": "1000"})
    tricklers = [connect(server) for _ in range(8)]
    for sock in tricklers:
        sock.sendall(request_head("/v1/attention", 100_000))
    t0 = time.monotonic()
    for _ in range(2):  # a byte every 0.7 s: far under 1000 bytes/s
        for sock in tricklers:
            sock.sendall(b" ")
        time.sleep(0.7)
    # Meanwhile ordinary requests are served: the tricklers hold no compute slot.
    assert httpx.post(server.url + "/v1/attention", json=ATTENTION, timeout=10).status_code == 200
    for sock in tricklers:
        status, headers, body = read_response(sock)
        assert status == 408, body
        assert headers["connection"] == "close" and headers["content-type"] == "application/problem+json"
        assert b"did not arrive in time" in body
        assert closed_by_server(sock, 10)
        sock.close()
    assert time.monotonic() - t0 < 20
    text = httpx.get(server.url + "/metrics").text
    assert metric_value(text, "attn_http_requests_rejected_total", reason="body_timeout") == 8


def test_big_headers_are_431_and_close_the_connection(live_server) -> None:  # type: ignore[no-untyped-def]
    server = live_server({"ATTN_MAX_HEADER_BYTES": "4096"})
    sock = connect(server)
    sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: test\r\nx-filler: ")
    try:
        for _ in range(100):  # 1 MB of an unfinished header: refused after the first few KB
            sock.sendall(b"a" * 10_000)
    except (BrokenPipeError, ConnectionResetError):
        pass
    status, headers, body = read_response(sock)
    assert status == 431 and headers["connection"] == "close"
    assert orjson.loads(body)["status"] == 431
    assert closed_by_server(sock, 10)
    sock.close()
    # Headers under the limit are served.
    assert httpx.get(server.url + "/healthz", headers={"x-filler": "a" * 2000}).status_code == 200


def test_silent_and_idle_connections_are_closed(live_server) -> None:  # type: ignore[no-untyped-def]
    server = live_server({"ATTN_HEADER_TIMEOUT_S": "1", "ATTN_KEEP_ALIVE_TIMEOUT_S": "1"})
    silent = connect(server)  # sends nothing at all
    trickle = connect(server)
    trickle.sendall(b"GET /healthz HTTP/1.1\r\n")  # starts a request, never finishes its headers
    idle = connect(server)
    idle.sendall(b"GET /healthz HTTP/1.1\r\nhost: test\r\n\r\n")
    assert read_response(idle)[0] == 200  # then stays idle on the kept-alive connection
    t0 = time.monotonic()
    for sock in (silent, trickle, idle):
        assert closed_by_server(sock, 15)
        sock.close()
    assert time.monotonic() - t0 < 15


def test_a_client_that_stops_reading_is_disconnected(live_server) -> None:  # type: ignore[no-untyped-def]
    server = live_server({"ATTN_SEND_TIMEOUT_S": "1", "ATTN_GZIP_LEVEL": "0"})
    # Softmax of 2M float32 logits as base64: a ~16 MB JSON answer that the client never reads.
    logits = np.zeros(1 << 21, dtype="<f4")
    body = orjson.dumps(
        {
            "logits": {"shape": [128, 1 << 14], "dtype": "float32", "b64": base64.b64encode(logits.tobytes()).decode()},
            "encoding": "base64",
            "log": True,
        }
    )
    sock = connect(server)
    sock.sendall(request_head("/v1/softmax", len(body)) + body)
    t0 = time.monotonic()
    time.sleep(1)
    # Never read: the server must drop the connection after its send timeout.
    deadline = time.monotonic() + 30
    closed = False
    while time.monotonic() < deadline:
        r = httpx.get(server.url + "/metrics", timeout=10)
        if metric_value(r.text, "attn_http_requests_total", method="POST", route="/v1/softmax", status="200") == 1:
            break
        time.sleep(0.2)
    time.sleep(3)  # the answer has been handed to the connection; the client keeps not reading past the 1 s
    sock.settimeout(0.5)
    # The server aborted: reading now gives what the kernel buffers held, then a reset or EOF, never the
    # whole answer (probabilities and log-probabilities: 2 x 2M float32 as base64, over 22 MB).
    got = 0
    try:
        while time.monotonic() < deadline:
            try:
                chunk = sock.recv(1 << 20)
            except TimeoutError:
                continue
            if not chunk:
                closed = True
                break
            got += len(chunk)
    except ConnectionResetError:
        closed = True
    sock.close()
    assert closed and got < 20_000_000, got
    assert time.monotonic() - t0 < 40


def test_refused_at_the_headers_with_connection_close_body_unread(live_server) -> None:  # type: ignore[no-untyped-def]
    # One compute slot, no queue, and every admitted request takes 3 s (test setting).
    server = live_server(
        {"ATTN_MAX_CONCURRENT_REQUESTS": "1", "ATTN_MAX_QUEUED_REQUESTS": "0", "ATTN_DEBUG_DELAY_S": "3"}
    )
    holder = threading.Thread(
        target=lambda: httpx.post(server.url + "/v1/attention", json=ATTENTION, timeout=30), daemon=True
    )
    holder.start()
    wait_admitted(server.url)  # the first request is admitted and sleeping
    sock = connect(server)
    sock.sendall(request_head("/v1/attention", 2_000_000))  # headers only: the 2 MB body is never sent
    t0 = time.monotonic()
    status, headers, body = read_response(sock)
    assert time.monotonic() - t0 < 2.0  # at once, without waiting for a body
    assert status == 503 and headers["connection"] == "close" and int(headers["retry-after"]) >= 1
    assert closed_by_server(sock, 10)  # closed, not kept open to drain 2 MB
    sock.close()
    holder.join(30)
    text = httpx.get(server.url + "/metrics").text
    assert metric_value(text, "attn_http_requests_rejected_total", reason="queue_full") == 1


def test_a_costly_small_body_does_not_block_the_event_loop(live_server) -> None:  # type: ignore[no-untyped-def]
    """A ~2 KB request whose work is ~40 ms (bisection entmax over 160 keys for 330 queries) runs in a
    worker thread: /healthz keeps answering while several such requests are computed.
    """
    server = live_server()
    rng = np.random.default_rng(0)
    enc = lambda a: {"shape": list(a.shape), "dtype": "float16", "b64": base64.b64encode(a.tobytes()).decode()}  # noqa: E731
    body = orjson.dumps(
        {
            "query": enc(rng.standard_normal((1, 330, 1, 1)).astype("<f2")),
            "key": enc(rng.standard_normal((1, 1, 160, 1)).astype("<f2")),
            "value": enc(rng.standard_normal((1, 1, 160, 1)).astype("<f2")),
            "normalizer": "entmax",
            "alpha": 1.3,
            "return": ["output", "weights", "scores", "diagnostics"],
            "encoding": "base64",
        }
    )
    assert len(body) < 2048  # small enough to be a candidate for the event loop
    stop = threading.Event()
    answered: list[int] = []

    def load() -> None:
        with httpx.Client(timeout=60) as c:
            while not stop.is_set():
                answered.append(c.post(server.url + "/v1/attention", content=body).status_code)

    workers = [threading.Thread(target=load, daemon=True) for _ in range(8)]
    for w in workers:
        w.start()
    time.sleep(1.0)
    worst = 0.0
    with httpx.Client(timeout=10) as c:
        for _ in range(20):
            t0 = time.monotonic()
            assert c.get(server.url + "/healthz").status_code == 200
            worst = max(worst, time.monotonic() - t0)
            time.sleep(0.05)
    stop.set()
    for w in workers:
        w.join(60)
    assert answered and set(answered) == {200}, set(answered)
    assert worst < 3.0  # the liveness probe's timeout; in practice milliseconds
    # Every costly request waited for a compute slot (observed only for work in the thread pool) ...
    text = httpx.get(server.url + "/metrics").text
    assert metric_value(text, "attn_http_queue_wait_seconds_count") == len(answered)
    # ... while a cheap one of the same size runs on the event loop (no compute slot).
    assert httpx.post(server.url + "/v1/attention", json=ATTENTION).status_code == 200
    text = httpx.get(server.url + "/metrics").text
    assert metric_value(text, "attn_http_queue_wait_seconds_count") == len(answered)


def test_a_client_gone_mid_upload_is_499_without_a_traceback(live_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    server = live_server()
    sock = connect(server)
    sock.sendall(request_head("/v1/attention", 100_000, "x-request-id: gone-1\r\n") + b'{"query": [[1.0')
    time.sleep(0.5)
    sock.close()  # mid-upload
    for _ in range(100):
        text = httpx.get(server.url + "/metrics").text
        if metric_value(text, "attn_http_requests_total", method="POST", route="/v1/attention", status="499") == 1:
            break
        time.sleep(0.1)
    assert metric_value(text, "attn_http_requests_total", method="POST", route="/v1/attention", status="499") == 1
    assert metric_value(text, "attn_http_requests_total", method="POST", route="/v1/attention", status="500") == 0
    log = server.log()
    access = [line for line in log.splitlines() if '"request_id":"gone-1"' in line and '"message":"request"' in line]
    assert len(access) == 1 and '"status":499' in access[0], log
    assert "Traceback" not in log and '"level":"error"' not in log, log
