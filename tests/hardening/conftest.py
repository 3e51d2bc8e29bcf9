"""Apps with test engines (blocking, broken) and live servers (``live_server``) for the hardening tests."""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.engines.numpy_engine import NumpyEngine
from service.settings import Settings
from tests.e2e.conftest import free_port

ATTENTION = {"query": [[1.0, 0.0], [0.0, 1.0]], "key": [[1.0, 0.0], [0.0, 1.0]], "value": [[1.0, 2.0], [3.0, 4.0]]}
SOFTMAX = {"logits": [1.0, 2.0, 3.0]}


class BlockingEngine(NumpyEngine):
    """The numpy engine, but ``run`` waits until the test releases it (or ``max_wait_s`` passes)."""

    def __init__(self, max_wait_s: float = 10.0) -> None:
        super().__init__()
        self.release = threading.Event()
        self.started = threading.Semaphore(0)
        self.finished = threading.Event()
        self.max_wait_s = max_wait_s

    def run(self, task):  # type: ignore[no-untyped-def]
        self.started.release()
        self.release.wait(self.max_wait_s)
        try:
            return super().run(task)
        finally:
            self.finished.set()


class BrokenEngine(NumpyEngine):
    """An engine with a bug: ``run`` raises with internals in the message."""

    def run(self, task):  # type: ignore[no-untyped-def]
        raise RuntimeError("secret internals: /srv/attention/weights.bin at 0xdeadbeef")


def settings(**overrides: Any) -> Settings:
    return Settings(enable_onnx=False, **overrides)


@contextmanager
def client_for(engine: Any = None, **overrides: Any) -> Iterator[TestClient]:
    """A TestClient on an app with these settings (and ``engine`` as its only engine).

    With a test engine, all work goes to the thread pool (``inline_max_body_bytes=0``): a blocking
    engine run inline would block the event loop, and with it the deadline and the queue.
    """
    engines = None if engine is None else {"numpy": engine}
    if engine is not None:
        overrides.setdefault("inline_max_body_bytes", 0)
    app = create_app(settings(**overrides), engines=engines)
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


def status_kb(pid: int, field: str) -> int:
    """A line of /proc/<pid>/status in KiB (``VmRSS``, ``VmHWM``: a process's memory now and at its peak)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError(f"no {field}")


def settled_rss_kb(pid: int, below_kb: float, timeout_s: float = 20.0) -> int:
    """The process's ``VmRSS`` in KiB once it is below ``below_kb``, or its last reading after ``timeout_s`` seconds:
    a test waits for the memory it checks to come back (the heap trimmer gives it back once the process has been
    quiet for a second, later on a busy machine), not for a fixed time.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        now = status_kb(pid, "VmRSS")
        if now < below_kb or time.monotonic() > deadline:
            return now
        time.sleep(0.25)


def metric_value(text: str, name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` whose labels include ``labels`` in a Prometheus text exposition
    (0 when none): a series with more labels than asked (e.g. ``model``) still counts.
    """
    want = set(labels.items())
    total = 0.0
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        series, _, value = line.rpartition(" ")
        sample, _, label_text = series.partition("{")
        got = {tuple(pair.split("=", 1)) for pair in label_text.rstrip("}").split(",") if pair} if label_text else set()
        if sample == name and want <= {(k, v.strip('"')) for k, v in got}:
            total += float(value)
    return total


def wait_admitted(url: str, count: int = 1, timeout_s: float = 30.0) -> None:
    """Until at least ``count`` requests hold or wait for a compute slot on the server at ``url`` (its
    ``attn_http_requests_in_flight`` plus ``attn_http_requests_queued``): a test that needs requests in flight waits
    for them, not for a fixed time that a busy machine overruns (the request not sent yet, or its hold over).
    """
    deadline = time.monotonic() + timeout_s
    while True:
        text = httpx.get(url + "/metrics", timeout=10).text
        held = metric_value(text, "attn_http_requests_in_flight") + metric_value(text, "attn_http_requests_queued")
        if held >= count:
            return
        assert time.monotonic() < deadline, f"fewer than {count} requests admitted after {timeout_s} s ({held})"
        time.sleep(0.02)


PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not installed (Debian package 'prometheus'; .ci/run installs it)"
)


def promtool_check(text: str) -> None:
    """``promtool check metrics`` accepts the exposition (format and naming conventions)."""
    assert PROMTOOL is not None
    done = subprocess.run([PROMTOOL, "check", "metrics"], input=text.encode(), capture_output=True, timeout=60)
    assert done.returncode == 0, (done.stdout + done.stderr).decode()


# -- the app driven through ASGI, without a server --------------------------------------------------------------


def asgi_scope(path: str, headers: list[tuple[bytes, bytes]], method: str = "POST") -> dict:
    """An HTTP/1.1 ASGI scope for ``method path`` with these raw headers."""
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": headers,
        "client": ("127.0.0.1", 5000),
        "server": ("testserver", 80),
        "state": {},
    }


async def call_asgi(
    app: Any, headers: list[tuple[bytes, bytes]], chunks: list[bytes], path: str = "/v1/softmax", method: str = "POST"
) -> tuple[int, dict, bytes, int]:
    """Drive the ASGI app directly; returns (status, headers, body, how many body chunks it read)."""
    read = 0
    sent: list[dict] = []

    async def receive() -> dict:
        nonlocal read
        if read < len(chunks):
            read += 1
            return {"type": "http.request", "body": chunks[read - 1], "more_body": read < len(chunks)}
        await asyncio.sleep(3600)
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    await app(asgi_scope(path, headers, method), receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], {k.decode(): v.decode() for k, v in start["headers"]}, body, read


# -- live servers ---------------------------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[2]


class LiveServer:
    """``python -m service serve`` in a subprocess on a free port, with ATTN_* settings from ``env``."""

    def __init__(self, env: dict[str, str], tmp_path: Path, nofile: int | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = tmp_path / f"server-{self.port}.log"
        full_env = {k: v for k, v in os.environ.items() if not k.startswith(("ATTN_", "PROMETHEUS_"))}
        # The cost model's calibration (a second of CPU at start) only where a test asks for it.
        defaults = {"ATTN_ENABLE_ONNX": "false", "ATTN_COST_CALIBRATION": "off"}
        full_env.update({**defaults, "ATTN_PORT": str(self.port), "ATTN_GRPC_PORT": "0", **env})
        self._log = open(self.log_path, "wb")  # noqa: SIM115 -- open for the server's life; stop() closes it

        def limit_descriptors() -> None:  # in the child: RLIMIT_NOFILE soft and hard, as a container sets it
            if nofile is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

        self.proc = subprocess.Popen(
            [sys.executable, "-m", "service", "serve"],
            cwd=ROOT,
            env=full_env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            preexec_fn=limit_descriptors if nofile is not None else None,
            start_new_session=True,  # its own process group: close() ends the workers it forked too
        )

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if httpx.get(self.url + "/readyz", timeout=1.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"server not ready in {timeout_s} s:\n{self.log()}")

    def terminate(self) -> None:
        self.proc.send_signal(signal.SIGTERM)

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def close(self) -> None:
        """Kill the server and every process of its group (workers outlive a killed supervisor otherwise)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        self._log.close()


@pytest.fixture
def live_server(tmp_path: Path) -> Iterator[Any]:
    """A factory: ``live_server(env)`` starts a server and waits until it is ready."""
    servers: list[LiveServer] = []

    def start(env: dict[str, str] | None = None, *, nofile: int | None = None) -> LiveServer:
        server = LiveServer(env or {}, tmp_path, nofile)
        servers.append(server)
        server.wait_ready()
        return server

    yield start
    for server in servers:
        server.close()
