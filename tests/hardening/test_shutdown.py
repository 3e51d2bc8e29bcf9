"""Shutdown on a live server (issue 21, item 13): requests still running when the grace period ends are answered
503 with ``Retry-After`` and ``Connection: close``, recorded as such, without a traceback (they got 500 and a
``CancelledError`` traceback each).
"""

from __future__ import annotations

import threading
import time

import httpx
import orjson
import pytest

from tests.hardening.conftest import SOFTMAX, wait_admitted

pytestmark = pytest.mark.slow  # each test starts a live server


def test_requests_cut_off_by_the_grace_period_get_503(live_server) -> None:  # type: ignore[no-untyped-def]
    server = live_server({"ATTN_DEBUG_DELAY_S": "30", "ATTN_REQUEST_TIMEOUT_S": "60", "ATTN_SHUTDOWN_GRACE_S": "1"})
    answers: list[httpx.Response | Exception] = []

    def slow_request(i: int) -> None:
        try:
            with httpx.Client(timeout=30) as c:
                answers.append(c.post(server.url + "/v1/softmax", json=SOFTMAX, headers={"x-request-id": f"cut-{i}"}))
        except httpx.TransportError as exc:
            answers.append(exc)

    workers = [threading.Thread(target=slow_request, args=(i,)) for i in range(8)]
    for w in workers:
        w.start()
    wait_admitted(server.url, 8)  # all eight in flight: two holding the compute slots, six waiting for one
    t0 = time.monotonic()
    server.terminate()
    assert server.proc.wait(30) == 0, server.log()
    assert time.monotonic() - t0 < 10
    for w in workers:
        w.join(30)
    assert len(answers) == 8
    for r in answers:
        assert isinstance(r, httpx.Response), r
        assert r.status_code == 503, r.text
        assert r.headers["connection"] == "close" and int(r.headers["retry-after"]) >= 1
        assert r.headers["content-type"] == "application/problem+json"
        assert "shutting down" in r.json()["detail"]
    log = server.log()
    assert "Traceback" not in log and "CancelledError" not in log, log
    access = [orjson.loads(line) for line in log.splitlines() if '"message":"request"' in line and "cut-" in line]
    assert sorted(a["status"] for a in access) == [503] * 8, access
