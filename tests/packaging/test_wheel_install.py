"""A plain install, as a user makes it: build the wheels, install the server's into a fresh virtual environment,
start the server from an empty temporary directory, and wait for /readyz to say the ONNX engine is ready; its
command line works without the extras or says which to install. And one owner per package: the server's wheel
does not carry the client's ``attention_client``, so uninstalling one distribution leaves the other whole.

Slow (two wheel builds and an install with dependencies from the package index or pip's cache): marked ``slow``.
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
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import free_port

REPO = Path(__file__).resolve().parents[2]
INSTALL_TIMEOUT_S = 600
READY_TIMEOUT_S = 180

pytestmark = pytest.mark.slow


def run(command: list[str], cwd: Path, timeout: float, env: dict[str, str] | None = None) -> str:
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
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


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """The server's wheel and the client's, built from the checkout."""
    dist = tmp_path_factory.mktemp("dist")
    for project in (REPO, REPO / "clients" / "python"):
        run(
            [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(dist), str(project)],
            REPO,
            INSTALL_TIMEOUT_S,
        )
    (service,) = dist.glob("attention_service-*.whl")
    (client,) = dist.glob("attention_client-*.whl")
    yield {"service": service, "client": client}


def _venv(path: Path) -> Path:
    run([sys.executable, "-m", "venv", "--without-pip", str(path)], path.parent, 120)
    return path / "bin" / "python"


def _pip(python: Path, *args: str, cwd: Path) -> str:
    # This interpreter's pip installs into the new environment (--python): no bootstrap of a second pip.
    return run([sys.executable, "-m", "pip", "--python", str(python), *args], cwd, INSTALL_TIMEOUT_S)


def test_one_owner_per_package(wheels: dict[str, Path], tmp_path: Path) -> None:
    service = set(zipfile.ZipFile(wheels["service"]).namelist())
    client = set(zipfile.ZipFile(wheels["client"]).namelist())
    packages = {name.split("/")[0] for name in service | client if ".dist-info/" not in name}
    assert {n.split("/")[0] for n in service if ".dist-info/" not in n} == {"service"}, packages
    assert {n.split("/")[0] for n in client if ".dist-info/" not in n} == {"attention_client"}, packages
    assert {"service/client.py", "service/cli/local.py"} <= service
    assert {"attention_client/__init__.py", "attention_client/py.typed"} <= client
    page = ("index.html", "npy.js", "playground.css", "playground.js", "common.js", "charts.js")
    panels = ("attention.js", "gradients.js", "sampling.js", "decode.js", "rollout.js")
    static = {f"service/playground/static/{n}" for n in (*page, *panels)}
    assert static <= service, "the playground's files are package data"
    for wheel in wheels.values():  # the license travels with both
        assert any(n.endswith(".dist-info/licenses/LICENSE") for n in zipfile.ZipFile(wheel).namelist())
    metadata = (
        zipfile.ZipFile(wheels["service"]).read(next(n for n in service if n.endswith(".dist-info/METADATA"))).decode()
    )
    assert 'Requires-Dist: attention-client<1,>=0.1; extra == "client"' in metadata, metadata

    # Both installed, then one removed: the other keeps every file it brought.
    python = _venv(tmp_path / "venv")
    find = "import importlib.util as u; print(*(u.find_spec(n) is not None for n in ('attention_client', 'service')))"
    _pip(python, "install", "--quiet", "--no-deps", str(wheels["service"]), str(wheels["client"]), cwd=tmp_path)
    _pip(python, "uninstall", "--yes", "--quiet", "attention-service", cwd=tmp_path)
    assert run([str(python), "-c", find], tmp_path, 60).split() == ["True", "False"]
    _pip(python, "install", "--quiet", "--no-deps", str(wheels["service"]), cwd=tmp_path)
    _pip(python, "uninstall", "--yes", "--quiet", "attention-client", cwd=tmp_path)
    assert run([str(python), "-c", find], tmp_path, 60).split() == ["False", "True"]


def test_wheel_installed_in_a_fresh_venv_serves_onnx_and_its_command_line_works(
    wheels: dict[str, Path], tmp_path: Path
) -> None:
    venv, workdir = tmp_path / "venv", tmp_path / "elsewhere"
    workdir.mkdir()
    python = _venv(venv)
    lock = REPO / "requirements.lock"
    if lock.is_file():
        _pip(python, "install", "--quiet", "--require-hashes", "-r", str(lock), cwd=workdir)
        _pip(python, "install", "--quiet", "--no-deps", str(wheels["service"]), cwd=workdir)
    else:
        _pip(python, "install", "--quiet", str(wheels["service"]), cwd=workdir)

    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ATTN_", "ATTENTION_", "PYTHON"))}
    cli = venv / "bin" / "attention-service"

    # The command line of a plain install (no httpx, no client, no onnx, no PyYAML): each command works,
    # or exits 2 with one line naming what to install.
    version = run([str(cli), "--version"], workdir, 60, env)
    assert version.startswith("attention-service ") and "attention-client not installed" in version
    local = run([str(cli), "softmax", "--scores", "1.0,0.5,2.5,-0.1", "--local", "--json"], workdir, 120, env)
    assert [round(p, 4) for p in json.loads(local)["probabilities"]] == [0.1557, 0.0945, 0.698, 0.0518]
    schema = json.loads(run([str(cli), "openapi"], workdir, 120, env))
    assert "/v1/attention" in schema["paths"]
    for args, needs in (
        (["softmax", "--scores", "1,2", "--url", f"http://127.0.0.1:{port}"], "pip install ./clients/python"),
        (["export-models", "--out", str(workdir / "m")], "attention-service[export]"),
    ):
        done = subprocess.run([str(cli), *args], cwd=workdir, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert needs in done.stderr and "Traceback" not in done.stderr

    # Free ports by the flags (both: gRPC's default, 8001, may be another server's, as `make serve`'s).
    env["ATTN_LOG_LEVEL"] = "warning"
    serve = [str(python), "-m", "service", "serve", "--port", str(port), "--grpc-port", str(free_port())]
    log = tmp_path / "server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(serve, cwd=workdir, env=env, stdout=out, stderr=subprocess.STDOUT)
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
