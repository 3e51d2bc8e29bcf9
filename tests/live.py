"""Live servers for tests: `python -m service serve` subprocesses on free ports, with the settings a test needs."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from tests.e2e.conftest import LIVE_ENV, LiveServer, free_port, started

API_KEY = "client-tests-key-0123456789"


@contextmanager
def serve(**env: str) -> Iterator[LiveServer]:
    """A server started as production starts it (ONNX off), with extra ``ATTN_*`` settings."""
    host, port = "127.0.0.1", free_port()
    with started(["-m", "service", "serve", "--host", host, "--port", str(port)], port, {**LIVE_ENV, **env}, host) as s:
        yield s
