"""Live servers for the gRPC tests: ``python -m service serve`` with gRPC on a known free port."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

import grpc
import pytest

from tests.e2e.conftest import LIVE_ENV, free_port, started

API_KEY = "grpc-tests-key-0123456789"


@dataclass(frozen=True)
class GrpcServer:
    url: str
    """The REST base URL, ``http://host:port``."""
    target: str
    """The gRPC address, ``host:port`` (as tritonclient.grpc takes it)."""
    pid: int | None = None


def wait_serving(target: str, timeout_s: float = 30.0) -> None:
    """Until the gRPC port answers (REST is ready first: the engines are shared)."""
    deadline = time.monotonic() + timeout_s
    while True:
        with grpc.insecure_channel(target) as channel:
            try:
                grpc.channel_ready_future(channel).result(timeout=1)
                return
            except grpc.FutureTimeoutError:
                if time.monotonic() > deadline:
                    raise


@contextmanager
def grpc_server(**env: str) -> Iterator[GrpcServer]:
    host, port, grpc_port = "127.0.0.1", free_port(), free_port()
    settings = {**LIVE_ENV, "ATTN_GRPC_PORT": str(grpc_port), **env}
    with started(["-m", "service", "serve", "--host", host, "--port", str(port)], port, settings, host) as s:
        target = f"{host}:{grpc_port}"
        wait_serving(target)
        yield GrpcServer(s.url, target, s.pid)


@pytest.fixture(scope="session")
def server() -> Iterator[GrpcServer]:
    """Default settings (ONNX off for a fast start, a 40 MiB body limit for the 30 MB request)."""
    with grpc_server(ATTN_MAX_BODY_BYTES=str(40 << 20)) as s:
        yield s


@pytest.fixture(scope="session")
def keyed_server() -> Iterator[GrpcServer]:
    with grpc_server(ATTN_API_KEYS=API_KEY) as s:
        yield s


@pytest.fixture
def server_with() -> Iterator[Callable[..., GrpcServer]]:
    """A factory of servers with extra ``ATTN_*`` settings, each stopped at the end of the test."""
    with ExitStack() as stack:
        yield lambda **env: stack.enter_context(grpc_server(**env))
