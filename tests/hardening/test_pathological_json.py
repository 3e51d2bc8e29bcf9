"""Pathological JSON on a live server (issue 21, item 9): what cannot be a valid tensor is refused from its bytes,
before any Python object is built for its elements, so the event loop keeps answering and memory stays flat.
``{"query": [[], [], ... 3,000,000 times], ...}`` (8.6 MB) held the interpreter's lock for 1.1 s (/healthz took
0.6 to 3.3 s meanwhile) and grew the process by 350 to 750 MB.
"""

from __future__ import annotations

import gc
import threading
import time

import httpx
import pytest

from tests.hardening.conftest import status_kb

pytestmark = pytest.mark.slow  # starts a live server

KV = b', "key": [[1.0]], "value": [[1.0]]'


def post_while_probing(url: str, body: bytes) -> tuple[httpx.Response, float, float]:
    """POST ``body`` while /healthz is asked every 20 ms: (the answer, its time, the slowest probe).

    The collector is off meanwhile: a full collection of the test run's own heap would stall the probe in
    this process, not in the server.
    """
    stop = threading.Event()
    slowest = [0.0]

    def probe() -> None:
        with httpx.Client(timeout=30) as c:
            while not stop.is_set():
                t0 = time.monotonic()
                c.get(url + "/healthz")
                slowest[0] = max(slowest[0], time.monotonic() - t0)
                time.sleep(0.02)

    prober = threading.Thread(target=probe)
    gc.disable()
    try:
        prober.start()
        time.sleep(0.2)
        t0 = time.monotonic()
        headers = {"content-type": "application/json"}
        r = httpx.post(url + "/v1/attention", content=body, headers=headers, timeout=60)
        took = time.monotonic() - t0
        time.sleep(0.2)
    finally:
        stop.set()
        prober.join(30)
        gc.enable()
    return r, took, slowest[0]


CASES = {
    # 3,000,000 empty lists: more rows than a dimension may have, and empty ones
    "empty lists": (b'{"query": [' + b"[]," * 2_999_999 + b"[]]" + KV + b"}", ["query", "shape", 0]),
    # (16384, 64, 1), ragged at the very end, every row before it fine: a million inner lists, read from the bytes
    "ragged": (
        b'{"query": [' + (b"[" + b"[1.0]," * 63 + b"[1.0]],") * 16_383 + b"[" + b"[1.0]," * 62 + b"[1.0]]]" + KV + b"}",
        ["query", 16383],
    ),
    # a field that is not a tensor, built of millions of lists
    "not a tensor": (b'{"query": [[1.0]]' + KV + b', "return": [' + b"[]," * 2_999_999 + b"[]]}", ["return"]),
    # a string at the end of a million numbers (1024 x 1024, within the limits)
    "a string": (
        b'{"query": ['
        + b"["
        + b"1.0," * 1023
        + b"1.0],"
        + (b"[" + b"1.0," * 1023 + b"1.0],") * 1022
        + b"["
        + b"1.0," * 1023
        + b'"x"]]'
        + KV
        + b"}",
        ["query", 1023, 1023],
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_pathological_json_is_refused_from_its_bytes(live_server, case: str) -> None:  # type: ignore[no-untyped-def]
    body, loc = CASES[case]
    server = live_server()
    pid = server.proc.pid
    httpx.get(server.url + "/healthz")
    before = status_kb(pid, "VmRSS")
    # Timed on a shared 2-core machine, a single probe can meet a scheduler stall (one CI run saw 0.37 s where
    # quiet runs give 0.02 to 0.1 s). A second try tells that from the fault this guards against, which held
    # the lock for over a second on every try: each try must pass the memory check, one the timing checks.
    tries = []
    for _ in range(2):
        r, took, slowest = post_while_probing(server.url, body)
        assert r.status_code == 422, r.text[:500]
        assert any(e["loc"] == loc for e in r.json()["errors"]), r.json()
        grown_mb = (status_kb(pid, "VmRSS") - before) / 1024
        assert grown_mb < 150, grown_mb  # the body itself and its parse, not millions of Python lists
        tries.append((took, slowest))
        if took < 2.0 and slowest < 0.3:  # answered in time, and the liveness probe answered meanwhile
            break
    else:
        raise AssertionError(f"(took, slowest probe) in seconds, per try: {tries}")
