"""A plain install, as a user makes it: build the wheel, install it into a fresh virtual environment,
start the server from an empty temporary directory, and wait for /readyz to say the ONNX engine is ready.

Slow (a wheel build and an install with dependencies from the package index or pip's cache): marked ``slow``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.e2e.conftest import free_port

REPO = Path(__file__).resolve().parents[2]
INSTALL_TIMEOUT_S = 600
READY_TIMEOUT_S = 180


def run(command: list[str], cwd: Path, timeout: float) -> str:
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, (
        f"{command} exited {result.returncode}:\n{result.stdout[-3000:]}{result.stderr[-3000:]}"
    )
    return result.stdout


def get_json(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


@pytest.mark.slow
def test_wheel_installed_in_a_fresh_venv_serves_onnx_from_anywhere(tmp_path: Path) -> None:
    dist, venv, workdir = tmp_path / "dist", tmp_path / "venv", tmp_path / "elsewhere"
    workdir.mkdir()
    run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(dist), str(REPO)],
        REPO,
        INSTALL_TIMEOUT_S,
    )
    (wheel,) = dist.glob("attention_service-*.whl")
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp_path, 120)
    python = venv / "bin" / "python"
    # This interpreter's pip installs into the new environment (--python): no bootstrap of a second pip.
    lock = REPO / "requirements.lock"
    install = [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet"]
    if lock.is_file():
        run([*install, "--require-hashes", "-r", str(lock)], workdir, INSTALL_TIMEOUT_S)
        run([*install, "--no-deps", str(wheel)], workdir, INSTALL_TIMEOUT_S)
    else:
        run([*install, str(wheel)], workdir, INSTALL_TIMEOUT_S)

    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ATTN_", "PYTHON"))}
    env |= {"ATTN_PORT": str(port), "ATTN_LOG_LEVEL": "warning"}
    log = tmp_path / "server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [str(python), "-m", "service", "serve"], cwd=workdir, env=env, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline, status, body = time.monotonic() + READY_TIMEOUT_S, 0, {}
        while time.monotonic() < deadline:
            assert proc.poll() is None, f"the server exited with {proc.returncode}:\n{log.read_text()[-4000:]}"
            try:
                status, body = get_json(url + "/readyz")
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                status = 0
            if status == 200:
                break
            time.sleep(0.2)
        assert status == 200, f"/readyz {status} {body}\n{log.read_text()[-4000:]}"
        assert body["engines"] == {"numpy": True, "onnx": True}, body
        _, engines = get_json(url + "/v1/engines")
        (onnx,) = [e for e in engines["engines"] if e["name"] == "onnx"]
        # The graphs came from the installed package, not from this checkout or the working directory
        # (answers name no server path: /v1/engines says where the graphs come from in words).
        assert onnx["models_source"] == "package", onnx
        assert not (workdir / "models").exists()
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, log.read_text()[-4000:]
