"""A live server for end-to-end tests: uvicorn in a subprocess on a free port.

Started once per test session the way production starts it
(``uvicorn --factory service.asgi:create_app_from_env``), with the ONNX engine
off for a fast start-up; torn down (SIGTERM, then SIGKILL) at the end.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 30.0

# Settings of the live server: small enough that the gzip-bomb test stays cheap. The cost model's calibration (about
# 1.5 s of CPU before the server listens) only where a test asks for it (tests/hardening/test_cost_model.py): these
# servers price requests by the reference constants.
LIVE_ENV = {
    "ATTN_ENABLE_ONNX": "false",
    "ATTN_LOG_LEVEL": "warning",
    "ATTN_MAX_BODY_BYTES": str(16 << 20),
    "ATTN_COST_CALIBRATION": "off",
}


@dataclass(frozen=True)
class LiveServer:
    host: str
    port: int
    pid: int | None = None
    """The server process (to signal it)."""

    @property
    def url(self) -> str:
        """The base URL, ``http://host:port``."""
        return f"http://{self.host}:{self.port}"

    @property
    def authority(self) -> str:
        """``host:port``, as tritonclient takes it."""
        return f"{self.host}:{self.port}"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = START_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
        try:
            with urllib.request.urlopen(url + "/readyz", timeout=1) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.05)
    raise RuntimeError(f"the server was not ready within {timeout} s:\n{log.read_text()[-4000:]}")


@contextmanager
def started(args: Sequence[str], port: int, env: Mapping[str, str], host: str = "127.0.0.1") -> Iterator[LiveServer]:
    """``python <args>`` (a server on ``host:port``) with ``env`` added to the environment, once it answers
    ``/readyz``; stopped afterwards (SIGTERM, then SIGKILL).
    """
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "server.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [sys.executable, *args],
                cwd=ROOT,
                env={**os.environ, **env},
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: the end kills the workers it forked too
            )
            try:
                wait_ready(f"http://{host}:{port}", proc, log)
                yield LiveServer(host, port, proc.pid)
            finally:
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)
                with contextlib.suppress(ProcessLookupError):  # workers a killed supervisor left behind
                    os.killpg(proc.pid, signal.SIGKILL)


@pytest.fixture(scope="session")
def live_server() -> Iterator[LiveServer]:
    host, port = "127.0.0.1", free_port()
    factory = ["-m", "uvicorn", "--factory", "service.asgi:create_app_from_env", "--host", host, "--port", str(port)]
    with started([*factory, "--log-level", "warning", "--no-access-log"], port, LIVE_ENV, host) as server:
        yield server
