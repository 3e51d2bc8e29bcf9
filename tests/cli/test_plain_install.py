"""A plain install's command line: every command works without the extras or exits 2 with one line that
says what to install; ``--version``; the program's name as invoked; a closed pipe ends quietly.

A plain install is simulated by a meta-path hook that refuses the extras' modules (httpx, the client,
PyYAML, onnx) before ``python -m service`` runs; tests/packaging/test_wheel_install.py checks a real one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from service import __version__
from tests.e2e.conftest import ROOT

pytestmark = pytest.mark.slow

BLOCKED = ("httpx", "attention_client", "yaml", "onnx")
RUN_BLOCKED = """
import runpy, sys
BLOCKED = set(sys.argv[1].split(","))
class Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, Blocker())
sys.argv = sys.argv[1:]
runpy.run_module("service", run_name="__main__", alter_sys=True)
"""


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("ATTN_", "ATTENTION_"))}


def plain(*args: str, blocked: tuple[str, ...] = BLOCKED) -> subprocess.CompletedProcess[str]:
    """``python -m service ARGS`` where the extras' modules cannot be imported."""
    return subprocess.run(
        [sys.executable, "-c", RUN_BLOCKED, ",".join(blocked), *args],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def one_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in text, text
    return lines[0]


def test_local_computes_without_httpx_or_the_client() -> None:
    done = plain("softmax", "--scores", "1.0,0.5,2.5,-0.1", "--local", "--json")
    assert done.returncode == 0, done.stderr
    np.testing.assert_allclose(json.loads(done.stdout)["probabilities"], [0.1557, 0.0945, 0.6980, 0.0518], atol=1e-4)
    table = plain("attention", "--query", "1,0;0,1", "--key", "1,0;0,1", "--value", "1;2", "--local")
    assert table.returncode == 0 and "output (2, 1) float64" in table.stdout, table.stderr


def test_remote_calls_without_the_client_name_what_to_install() -> None:
    done = plain("softmax", "--scores", "1,2", "--url", "http://127.0.0.1:9")
    assert done.returncode == 2 and done.stdout == ""
    line = one_line(done.stderr)
    assert "pip install ./clients/python" in line and "'client' extra" in line and "--local" in line
    # the client installed but not its httpx: the same line, naming httpx
    done = plain("calibrate", "--logits", "1,0;0,1", "--labels", "0,1", blocked=("httpx",))
    assert done.returncode == 2 and "httpx is missing" in one_line(done.stderr)


def test_export_models_without_onnx_names_the_extra(tmp_path: Path) -> None:
    done = plain("export-models", "--out", str(tmp_path / "models"))
    assert done.returncode == 2 and not (tmp_path / "models").exists()
    assert "pip install 'attention-service[export]'" in one_line(done.stderr)


def test_openapi_is_json_without_pyyaml_and_yaml_with_it(tmp_path: Path) -> None:
    done = plain("openapi")
    assert done.returncode == 0, done.stderr
    schema = json.loads(done.stdout)
    assert schema["openapi"].startswith("3.") and "/v1/attention" in schema["paths"]
    refused = plain("openapi", "--format", "yaml")
    assert refused.returncode == 2 and "PyYAML" in one_line(refused.stderr)
    with_yaml = plain("openapi", "--out", str(tmp_path / "schema.yaml"), blocked=("httpx", "onnx"))
    assert with_yaml.returncode == 0, with_yaml.stderr
    text = (tmp_path / "schema.yaml").read_text()
    assert text.startswith("# Generated") and yaml.safe_load(text) == schema
    assert plain("openapi", "--out", str(tmp_path / "schema.json"), blocked=()).returncode == 0
    assert json.loads((tmp_path / "schema.json").read_text()) == schema


def test_version_and_help_need_nothing_installed() -> None:
    done = plain("--version")
    assert done.returncode == 0 and done.stdout.startswith(f"attention-service {__version__} (attention-client ")
    for command in ("serve", "attention", "softmax", "backward", "analyze", "sample", "calibrate", "openapi"):
        assert plain(command, "--help").returncode == 0, command


def test_the_usage_line_names_the_program_as_invoked() -> None:
    module = subprocess.run(
        [sys.executable, "-m", "service", "softmax"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert module.returncode == 2 and module.stderr.startswith("usage: python -m service softmax ")
    script = Path(sys.executable).with_name("attention-service")
    if not script.exists():
        pytest.skip("the attention-service console script is not installed beside this interpreter")
    done = subprocess.run([str(script), "softmax"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.startswith("usage: attention-service softmax ")
    assert "attention-service softmax: error:" in done.stderr
    version = subprocess.run([str(script), "--version"], capture_output=True, text=True, timeout=60)
    assert version.stdout.startswith(f"attention-service {__version__}")


def test_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    np.save(tmp_path / "scores.npy", np.linspace(-3, 3, 40000).reshape(40, 1000))  # more than a pipe buffers
    proc = subprocess.Popen(
        [sys.executable, "-m", "service", "softmax", "--scores", str(tmp_path / "scores.npy"), "--local", "--json"],
        cwd=ROOT,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    head = [proc.stdout.readline() for _ in range(2)]  # as `| head -2` does, then the reader goes away
    proc.stdout.close()
    stderr = proc.stderr.read().decode()
    proc.stderr.close()
    proc.wait(timeout=120)
    assert head[0] == b"{\n" and b"probabilities" in head[1]
    assert "Traceback" not in stderr and "BrokenPipeError" not in stderr, stderr
    assert proc.returncode == 141  # 128 + SIGPIPE, as `yes | head` gives
