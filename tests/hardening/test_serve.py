"""``python -m service serve`` live: graceful shutdown on SIGTERM, 504 on the wire, no version banner,
refusal to start on unsafe settings, metrics merged across worker processes, and a port another process holds
(issue 27, item 9): one line that names the port and its flag and setting, exit 3, with one worker or several.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from service.engines.onnx_engine.heap import huge_pages_possible
from tests.e2e.conftest import free_port
from tests.hardening.conftest import ROOT, SOFTMAX, metric_value, needs_promtool, promtool_check, wait_admitted

pytestmark = pytest.mark.slow  # each test starts a live server


def test_sigterm_lets_the_request_in_flight_finish_then_exits_0(live_server) -> None:  # type: ignore[no-untyped-def]
    # ATTN_DEBUG_DELAY_S (test-only) makes every admitted request take 2 s.
    server = live_server({"ATTN_DEBUG_DELAY_S": "2", "ATTN_SHUTDOWN_GRACE_S": "20"})
    result: dict = {}

    def slow_request() -> None:
        with httpx.Client(timeout=30) as c:
            result["response"] = c.post(server.url + "/v1/softmax", json=SOFTMAX)

    worker = threading.Thread(target=slow_request)
    worker.start()
    wait_admitted(server.url)  # the request is in flight, sleeping inside the server
    server.terminate()
    time.sleep(0.5)
    with pytest.raises(httpx.TransportError):  # the listening socket is closed: no new requests
        httpx.get(server.url + "/healthz", timeout=2)
    worker.join(30)
    assert result["response"].status_code == 200, server.log()
    assert result["response"].json()["probabilities"]
    assert server.proc.wait(30) == 0, server.log()
    log = server.log()
    assert '"path":"/v1/softmax","status":200' in log  # the access line of the finished request


def test_grace_period_bounds_the_wait(live_server) -> None:  # type: ignore[no-untyped-def]
    server = live_server({"ATTN_DEBUG_DELAY_S": "30", "ATTN_REQUEST_TIMEOUT_S": "60", "ATTN_SHUTDOWN_GRACE_S": "1"})
    result: dict = {}

    def slow_request() -> None:
        try:
            with httpx.Client(timeout=30) as c:
                result["response"] = c.post(server.url + "/v1/softmax", json=SOFTMAX)
        except httpx.TransportError as exc:
            result["error"] = exc

    worker = threading.Thread(target=slow_request)
    worker.start()
    wait_admitted(server.url)
    t0 = time.monotonic()
    server.terminate()
    assert server.proc.wait(30) == 0, server.log()
    assert time.monotonic() - t0 < 10  # cancelled after the 1 s grace period, not after 30 s
    worker.join(30)
    assert "response" not in result or result["response"].status_code != 200


def test_no_server_banner_and_504_at_the_deadline_on_the_wire(live_server) -> None:  # type: ignore[no-untyped-def]
    server = live_server({"ATTN_DEBUG_DELAY_S": "3", "ATTN_REQUEST_TIMEOUT_S": "0.5", "ATTN_QUEUE_TIMEOUT_S": "0.2"})
    t0 = time.monotonic()
    r = httpx.post(server.url + "/v1/softmax", json=SOFTMAX, timeout=30)
    assert r.status_code == 504 and r.headers["content-type"] == "application/problem+json"
    assert time.monotonic() - t0 < 2.5  # at the deadline, not when the 3 s of work end
    for path in ("/healthz", "/nope"):
        r = httpx.get(server.url + path)
        assert "server" not in r.headers, r.headers
        assert r.headers["x-content-type-options"] == "nosniff"
    server.terminate()
    assert server.proc.wait(30) == 0


def test_serve_refuses_to_start_on_unsafe_settings() -> None:
    key = "a-perfectly-good-key-0001"
    env = {"PATH": "/usr/bin:/bin", "ATTN_ENABLE_ONNX": "false", "ATTN_API_KEYS": f"{key},short"}
    done = subprocess.run(
        [sys.executable, "-m", "service", "serve"], cwd=ROOT, env=env, capture_output=True, timeout=60
    )
    assert done.returncode == 2
    err = done.stderr.decode()
    assert "refusing to start" in err and "key #2 has 5 characters" in err
    assert key not in err


@needs_promtool
def test_metrics_of_all_workers_are_merged(live_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Two uvicorn workers, multiprocess mode: whichever worker answers the scrape counts every request."""
    server = live_server({"ATTN_WORKERS": "2", "ATTN_METRICS_DIR": str(tmp_path / "metrics")})

    def worker_pids() -> set[str]:
        return {path.stem.rpartition("_")[2] for path in (tmp_path / "metrics").glob("counter_*.db")}

    with httpx.Client(base_url=server.url, timeout=10) as c:
        # New connections spread over the workers, but not evenly on a busy machine: send until
        # both workers have answered (bounded), then check the scrape counts every request.
        sent = 0
        while sent < 20 or (len(worker_pids()) < 2 and sent < 400):
            c.get("/healthz", headers={"connection": "close"})
            sent += 1
        assert len(worker_pids()) == 2, worker_pids()  # both workers keep their values in the shared directory
        counts = []
        for _ in range(20):  # a request is counted just after its answer is sent: allow the last one a moment
            text = c.get("/metrics", headers={"connection": "close"}).text
            counts.append(metric_value(text, "attn_http_requests_total", method="GET", route="/healthz", status="200"))
            if counts[-3:] == [sent] * 3:
                break
            time.sleep(0.05)
        assert counts[-3:] == [sent] * 3, (sent, counts)
        promtool_check(text)
    server.terminate()
    assert server.proc.wait(30) == 0


@contextmanager
def held_port(*, reuseport: bool = False) -> Iterator[int]:
    """A port this process listens on, as another server would hold it (``reuseport``: with ``SO_REUSEPORT``, as a
    server with several workers holds its gRPC port).
    """
    with socket.socket() as sock:
        if reuseport:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def serve(tmp_path: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    """``python -m service serve FLAGS`` with no ATTN_* port or worker variable; it must end by itself."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ATTN_", "PROMETHEUS_"))}
    env |= {"ATTN_ENABLE_ONNX": "false", "ATTN_COST_CALIBRATION": "off", "ATTN_METRICS_DIR": str(tmp_path / "m")}
    command = [sys.executable, "-m", "service", "serve", *flags]
    try:
        return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"the server started on a port another process holds: {exc.stderr!r}") from None


@pytest.mark.parametrize(("workers", "reuseport"), [(1, False), (2, False), (2, True)])
def test_a_grpc_port_another_process_holds_is_one_line_and_exit_3(
    tmp_path: Path, workers: int, reuseport: bool
) -> None:
    """A second instance (``make serve`` holds 8001): one line naming the port, ``--grpc-port`` and ``ATTN_GRPC_PORT``,
    exit 3 as for a taken REST port; no traceback, no abort. A port held with SO_REUSEPORT is refused too (several
    workers bind gRPC with it, and would silently share the other server's port).
    """
    with held_port(reuseport=reuseport) as grpc_port:
        done = serve(tmp_path, "--workers", str(workers), "--port", str(free_port()), "--grpc-port", str(grpc_port))
    assert done.returncode == 3, done.stdout[-2000:] + done.stderr[-3000:]
    (line,) = done.stderr.strip().splitlines()  # one line, and nothing on stdout
    assert f":{grpc_port} " in line and "--grpc-port" in line and "ATTN_GRPC_PORT" in line, line
    assert "Traceback" not in done.stdout + done.stderr


def test_a_rest_port_another_process_holds_is_one_line_and_exit_3(tmp_path: Path) -> None:
    with held_port() as port:
        done = serve(tmp_path, "--port", str(port), "--grpc-port", "0")
    assert done.returncode == 3, done.stderr[-3000:]
    (line,) = done.stderr.strip().splitlines()
    assert f":{port} " in line and "--port" in line and "ATTN_PORT" in line, line


def test_a_grpc_port_taken_once_the_app_starts_fails_it_with_one_line(tmp_path: Path) -> None:
    """The port taken after serve's check (uvicorn's factory runs no check): the start fails on gRPC's own bind
    with the same line, not a traceback (it was uvicorn's "Traceback ..." of the lifespan, JSON-escaped), and exit 3:
    with the ONNX engine still building its sessions the process aborted (SIGABRT, 134) two times in three.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ATTN_", "PROMETHEUS_"))}
    env |= {"ATTN_ENABLE_ONNX": "true", "ATTN_COST_CALIBRATION": "off"}
    factory = ["-m", "uvicorn", "--factory", "service.asgi:create_app_from_env", "--port", str(free_port())]
    with held_port() as grpc_port:
        env["ATTN_GRPC_PORT"] = str(grpc_port)
        done = subprocess.run([sys.executable, *factory], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    output = done.stdout + done.stderr
    assert done.returncode == 3, output[-3000:]
    assert f"cannot start: the gRPC port 127.0.0.1:{grpc_port} cannot be bound" in output, output[-3000:]
    assert "--grpc-port / ATTN_GRPC_PORT" in output and "Traceback" not in output, output[-3000:]


def _onnx_huge_pages(url: str) -> bool:
    """What the server's ONNX engine reports: whether its process's malloc asks for huge pages (read from the
    environment the process started with: glibc rewrites ``GLIBC_TUNABLES`` in /proc/PID/environ).
    """
    engines = {e["name"]: e for e in httpx.get(url + "/v1/engines").json()["engines"]}
    answer: bool = engines["onnx"]["malloc_huge_pages"]
    return answer


@pytest.mark.skipif(not huge_pages_possible(), reason="glibc before 2.35, or transparent huge pages off")
def test_serve_starts_itself_with_malloc_asking_for_huge_pages(live_server) -> None:  # type: ignore[no-untyped-def]
    onnx = {"ATTN_ENABLE_ONNX": "true"}
    assert _onnx_huge_pages(live_server({**onnx, "GLIBC_TUNABLES": "glibc.malloc.arena_max=4"}).url)
    # an operator's own value stands, and the setting turns it off
    assert not _onnx_huge_pages(live_server({**onnx, "GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}).url)
    assert not _onnx_huge_pages(live_server({**onnx, "ATTN_MALLOC_HUGE_PAGES": "false"}).url)
