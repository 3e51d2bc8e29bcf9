"""Live servers shared by the client, command-line and playground tests (see tests/live.py).

Every app the tests build, in-process or in a subprocess, serves gRPC on a port of its own choosing
(``ATTN_GRPC_PORT=0``): the default, 8001, would be shared by every server the suite starts at once.
A test that talks gRPC gives its server a known free port instead.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.e2e.conftest import ROOT, LiveServer
from tests.live import API_KEY, serve

os.environ.setdefault("ATTN_GRPC_PORT", "0")

LONGEST_FIRST = (
    "tests/hardening/test_schemathesis.py",
    "tests/playground/test_page.py",
    "tests/packaging/test_wheel_install.py",
    "tests/hardening/test_workers.py",
    "tests/grpc/test_hostile.py",
    "tests/cli/test_more_commands.py",
    "tests/hardening/test_serve_limits.py",
    "tests/hardening/test_serve.py",
    "tests/grpc/test_resources.py",
    "tests/docs/test_examples.py",
    "tests/grpc/test_guarantees.py",
    "tests/client/test_install.py",
    "tests/core/test_normalizers.py",
    "tests/cli/test_commands.py",
    "tests/hardening/test_connections.py",
    "tests/cli/test_plain_install.py",
)
"""The test files that take longest (20 to 120 s each in a serial run, `pytest --durations=0`, 2026-11-28), longest
first. ``make test`` hands whole files to its xdist workers in collection order (``--dist loadfile``): these go
first, so that none of them starts last while the other workers have nothing left to do."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The files of :data:`LONGEST_FIRST` first, in its order; every other file after them, in its own order."""
    missing = [name for name in LONGEST_FIRST if not (ROOT / name).is_file()]
    if missing:
        raise pytest.UsageError(f"tests/conftest.py LONGEST_FIRST names files that do not exist: {missing}")
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.relative_to(ROOT).as_posix(), len(rank)))


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
