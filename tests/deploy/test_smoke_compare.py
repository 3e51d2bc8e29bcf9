"""The container smoke test's comparison (deploy/podman/compare_with_engine.py) against a live server (issue 27,
item 9): its in-process app listens on no port, so a server that holds gRPC's default port (``make serve``) cannot
stop it, and a comparison that could not run says so (exit 2), where it reported "the answers differ" (exit 1).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from tests.e2e.conftest import ROOT
from tests.live import serve

SCRIPT = ROOT / "deploy" / "podman" / "compare_with_engine.py"

pytestmark = pytest.mark.slow  # a live server with the ONNX engine


def compare(url: str, **env: str) -> subprocess.CompletedProcess[str]:
    """The script against ``url``, with these ``ATTN_*`` variables in its environment."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("ATTN_")} | env
    return subprocess.run([sys.executable, str(SCRIPT), url], env=full, capture_output=True, text=True, timeout=120)


def test_the_comparison_runs_beside_a_server_on_the_grpc_port_and_a_failed_start_is_no_difference() -> None:
    with socket.socket() as held, serve(ATTN_ENABLE_ONNX="true") as server:
        held.bind(("127.0.0.1", 0))
        held.listen()  # another server's gRPC port (8001 under `make serve`), as the script's settings see it
        done = compare(server.url, ATTN_GRPC_PORT=str(held.getsockname()[1]))
        assert done.returncode == 0, done.stdout + done.stderr[-3000:]
        assert "/v2 attention: 200" in done.stdout
        broken = compare(server.url, ATTN_QUEUE_TIMEOUT_S="99")  # refused settings: the app cannot start
    assert broken.returncode == 2, broken.stdout + broken.stderr[-3000:]
    assert "the comparison did not run" in broken.stderr and "Traceback" not in broken.stderr
