"""Live servers shared by the client, command-line and playground tests (see tests/live.py).

Every app the tests build, in-process or in a subprocess, serves gRPC on a port of its own choosing
(``ATTN_GRPC_PORT=0``): the default, 8001, would be shared by every server the suite starts at once.
A test that talks gRPC gives its server a known free port instead.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.e2e.conftest import LiveServer
from tests.live import API_KEY, serve

os.environ.setdefault("ATTN_GRPC_PORT", "0")


@pytest.fixture(scope="session")
def keyed_server() -> Iterator[LiveServer]:
    """API keys on, a 1 MiB body limit (for the 413 test)."""
    with serve(ATTN_API_KEYS=API_KEY, ATTN_MAX_BODY_BYTES=str(1 << 20)) as server:
        yield server


@pytest.fixture(scope="session")
def busy_server() -> Iterator[LiveServer]:
    """One request at a time, none queued, each held 1.5 s: a second concurrent request gets 503 + Retry-After."""
    with serve(
        ATTN_MAX_CONCURRENT_REQUESTS="1",
        ATTN_MAX_QUEUED_REQUESTS="0",
        ATTN_DEBUG_DELAY_S="1.5",
        ATTN_RETRY_AFTER_S="1",
        ATTN_LOG_LEVEL="error",
    ) as server:
        yield server


@pytest.fixture(scope="session")
def page_server() -> Iterator[LiveServer]:
    """Default settings (no API keys): what a person opening the playground meets."""
    with serve() as server:
        yield server
