"""Live servers for tests: `python -m service serve` subprocesses on free ports, with the settings a test needs."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.e2e.conftest import LIVE_ENV, ROOT, LiveServer, free_port, wait_ready

API_KEY = "client-tests-key-0123456789"


@contextmanager
def serve(**env: str) -> Iterator[LiveServer]:
    """A server started as production starts it (ONNX off), with extra ``ATTN_*`` settings."""
    host, port = "127.0.0.1", free_port()
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "server.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "service", "serve", "--host", host, "--port", str(port)],
                cwd=ROOT,
                env={**os.environ, **LIVE_ENV, **env},
                stdout=out,
                stderr=subprocess.STDOUT,
            )
            try:
                wait_ready(f"http://{host}:{port}", proc, log)
                yield LiveServer(host, port)
            finally:
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)
