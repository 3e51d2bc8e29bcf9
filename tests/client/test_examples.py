"""The examples in clients/python/examples run against a live server and print what they promise."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.e2e.conftest import ROOT, LiveServer
from tests.live import API_KEY

pytestmark = pytest.mark.slow

EXAMPLES = ROOT / "clients" / "python" / "examples"


def run_example(name: str, server: LiveServer) -> str:
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / name), server.url],
        env={**os.environ, "ATTENTION_API_KEY": API_KEY},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_quickstart(keyed_server: LiveServer) -> None:
    out = run_example("quickstart.py", keyed_server)
    assert "output (1, 4, 6, 16) float32, weights (1, 4, 6, 6)" in out
    assert "upper triangle of head 0 is zero: True" in out
    assert "softmax: [0.2704, 0.0546, 0.01, 0.665]" in out
    assert "log_softmax: [-1.3079, -2.9079, -4.6079, -0.4079]" in out
    assert "entropy: 0.8296" in out


def test_async_many(keyed_server: LiveServer) -> None:
    assert "16 answers, distinct request ids: 16" in run_example("async_many.py", keyed_server)


def test_errors(keyed_server: LiveServer) -> None:
    out = run_example("errors.py", keyed_server)
    assert "ValidationError 422:" in out and "E=3" in out
    assert "TransportError: no answer (is a ServiceError: True)" in out
