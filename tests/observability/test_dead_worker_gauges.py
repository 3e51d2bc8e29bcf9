"""Multi-worker metrics (issue 13, item 12): a killed worker's live gauges leave the merged scrape.

``attn_http_requests_in_flight`` is a ``livesum`` gauge: each worker writes its own file in the
multiprocess directory and the scrape adds them up. A worker killed with requests in flight never
removes its file, so before this fix the scrape kept its count forever. A real 2-worker server:
hold requests in flight on both workers, SIGKILL one, and the count must return to 0 once the
others finish and uvicorn has replaced the dead worker.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.mmap_dict import MmapedDict

from tests.hardening.conftest import (
    SOFTMAX,
    live_server,  # noqa: F401 -- the fixture, shared with the serve tests
    metric_value,
)

pytestmark = pytest.mark.slow  # starts a live server

IN_FLIGHT = "attn_http_requests_in_flight"


def in_flight_by_pid(directory: Path) -> dict[int, float]:
    """Each worker's own ``attn_http_requests_in_flight``, read from its gauge file."""
    values: dict[int, float] = {}
    for path in directory.glob("gauge_livesum_*.db"):
        pid = int(path.stem.rpartition("_")[2])
        for key, value, _, _ in MmapedDict.read_all_values_from_file(str(path)):
            if json.loads(key)[0] == IN_FLIGHT:
                values[pid] = value
    return values


def test_a_killed_workers_in_flight_count_is_dropped(live_server, tmp_path: Path) -> None:  # noqa: F811
    metrics_dir = tmp_path / "metrics"
    server = live_server({"ATTN_WORKERS": "2", "ATTN_METRICS_DIR": str(metrics_dir), "ATTN_DEBUG_DELAY_S": "3"})
    results: list[Any] = []

    def slow_request() -> None:
        try:  # a new connection each, so both workers get some
            r = httpx.post(server.url + "/v1/softmax", json=SOFTMAX, headers={"connection": "close"}, timeout=60)
            results.append(r.status_code)
        except httpx.HTTPError as exc:  # the killed worker's clients lose their connection
            results.append(type(exc).__name__)

    threads = [threading.Thread(target=slow_request) for _ in range(6)]
    for t in threads:
        t.start()
        time.sleep(0.05)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        busy = {pid: v for pid, v in in_flight_by_pid(metrics_dir).items() if v > 0}
        if busy:
            break
        time.sleep(0.05)
    assert busy, (in_flight_by_pid(metrics_dir), server.log()[-3000:])
    victim = max(busy, key=lambda pid: busy[pid])
    os.kill(victim, signal.SIGKILL)
    for t in threads:
        t.join(60)

    # uvicorn's supervisor notices, reaps and replaces the worker; its live gauges must go.
    deadline = time.monotonic() + 60
    scraped = None
    with httpx.Client(base_url=server.url, timeout=10) as c:
        while time.monotonic() < deadline:
            text = c.get("/metrics", headers={"connection": "close"}).text
            scraped = metric_value(text, IN_FLIGHT)
            replaced = "started worker process" in server.log() and len(in_flight_by_pid(metrics_dir)) >= 1
            if scraped == 0 and replaced and victim not in in_flight_by_pid(metrics_dir):
                break
            time.sleep(0.2)
    assert scraped == 0, (scraped, busy, in_flight_by_pid(metrics_dir), results)
    assert victim not in in_flight_by_pid(metrics_dir)
    assert not list(metrics_dir.glob(f"gauge_live*_{victim}.db"))
    # the supervisor says how the worker ended (service.observability.workers)
    assert f"worker process {victim} was killed by signal SIGKILL" in server.log()
    # the service still answers on two workers
    assert httpx.get(server.url + "/readyz", timeout=10).status_code == 200
    server.terminate()
    assert server.proc.wait(30) == 0
