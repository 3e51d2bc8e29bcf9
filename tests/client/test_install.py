"""Packaging: the client installs alone (httpx and numpy only); tests/packaging checks that it is the one owner
of ``attention_client`` (the server's wheel does not carry it).
"""

from __future__ import annotations

import os
import subprocess
import venv
from pathlib import Path

import pytest

from tests.e2e.conftest import ROOT, LiveServer
from tests.live import API_KEY

pytestmark = pytest.mark.slow

CLIENT = ROOT / "clients" / "python"


def _pip(python: Path, *args: str) -> None:
    done = subprocess.run(
        [str(python), "-m", "pip", "--disable-pip-version-check", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_client_alone_in_a_fresh_venv(tmp_path: Path, keyed_server: LiveServer) -> None:
    venv.create(tmp_path / "venv", with_pip=True)
    python = tmp_path / "venv" / "bin" / "python"
    _pip(python, "install", "--quiet", str(CLIENT))
    probe = (
        "import importlib.metadata as m, importlib.util as u, attention_client, pathlib;"
        "reqs = [r for r in m.requires('attention-client') if 'extra' not in r];"
        "print(sorted(r.split(';')[0].split('>')[0].split('<')[0].strip() for r in reqs));"
        "print([n for n in ('service', 'fastapi', 'onnxruntime', 'pydantic', 'orjson', 'pybase64') if u.find_spec(n)]);"
        "print((pathlib.Path(attention_client.__file__).parent / 'py.typed').exists())"
    )
    out = subprocess.run(
        [str(python), "-c", probe], capture_output=True, text=True, timeout=60, cwd=tmp_path, check=False
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:3] == ["['httpx', 'numpy']", "[]", "True"]
    # the stdlib JSON and base64 fallbacks against a real server
    example = CLIENT / "examples" / "quickstart.py"
    done = subprocess.run(
        [str(python), str(example), keyed_server.url],
        env={**os.environ, "ATTENTION_API_KEY": API_KEY},
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "softmax: [0.2704, 0.0546, 0.01, 0.665]" in done.stdout
