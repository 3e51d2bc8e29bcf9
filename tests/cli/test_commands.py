"""``python -m service attention|softmax|sample`` through subprocess: tables, JSON, exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from service.core.attention import attention
from service.core.types import AttentionParams
from tests.e2e.conftest import ROOT, LiveServer, free_port
from tests.live import API_KEY

pytestmark = pytest.mark.slow

ROW1 = "1.0,0.5,2.5,-0.1"


def cli(*args: str, key: str | None = API_KEY) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ATTN_", "ATTENTION_"))}
    if key is not None:
        env["ATTENTION_API_KEY"] = key
    return subprocess.run(
        [sys.executable, "-m", "service", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_softmax_table_against_a_server(keyed_server: LiveServer) -> None:
    done = cli("softmax", "--scores", ROW1, "--url", keyed_server.url)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split() == ["index", "score", "weight"]
    weights = [float(line.split()[2]) for line in lines[1:5]]
    assert weights == [0.1557, 0.0945, 0.6980, 0.0518]  # docs/concepts/contract.md, reference row 1
    assert lines[3].count("█") > lines[1].count("█") > lines[4].count("█")  # bars follow the weights
    assert "entropy 0.9169 nats" in done.stdout and "nonzero 4/4" in done.stdout and "max 0.6980 at 2" in done.stdout


def test_json_for_machines(keyed_server: LiveServer) -> None:
    done = cli("softmax", "--scores", "2.1,0.5,-1.2,3.0", "--temperature", "2", "--json", "--url", keyed_server.url)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    np.testing.assert_allclose(got["probabilities"], [0.3116, 0.1400, 0.0598, 0.4886], atol=1e-4)
    assert got["request_id"] and "raw" not in got


def test_the_api_key_comes_from_the_environment(keyed_server: LiveServer) -> None:
    done = cli("softmax", "--scores", ROW1, "--url", keyed_server.url, key=None)
    assert done.returncode == 1 and done.stdout == ""
    assert "401" in done.stderr and "API key" in done.stderr


def test_a_refused_request_exits_1_with_the_detail(keyed_server: LiveServer) -> None:
    done = cli("attention", "--query", "1,0,0;0,1,0", "--key", "1,0;0,1", "--value", "1;2", "--url", keyed_server.url)
    assert done.returncode == 1 and "422" in done.stderr and "E=" in done.stderr


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    assert cli("softmax").returncode == 2  # --scores missing
    bad = cli("softmax", "--scores", "1,two", "--local")
    assert bad.returncode == 2 and "'two' is not a number" in bad.stderr
    missing = cli("softmax", "--scores", str(tmp_path / "nope.npy"), "--local")
    assert missing.returncode == 2 and "no file" in missing.stderr
    np.savez(tmp_path / "x.npz", logits=np.zeros(3))
    member = cli("softmax", "--scores", f"{tmp_path / 'x.npz'}:other", "--local")
    assert member.returncode == 2 and "has no array 'other'" in member.stderr
    assert cli("softmax", "--scores", "1", "--local", "--url", "http://x").returncode == 2  # exclusive


def test_no_server_exits_1() -> None:
    done = cli("softmax", "--scores", ROW1, "--url", f"http://127.0.0.1:{free_port()}", "--timeout", "2")
    assert done.returncode == 1 and "could not reach the service" in done.stderr


def test_attention_local_from_files(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((2, 4, 8)), rng.standard_normal((2, 5, 8)), rng.standard_normal((2, 5, 3))
    np.savez(tmp_path / "qkv.npz", query=q, key=k)
    np.save(tmp_path / "v.npy", v)
    (tmp_path / "mask.json").write_text(json.dumps([[True, True, True, True, False]] * 4))
    npz = str(tmp_path / "qkv.npz")
    args = ["--query", npz, "--key", npz, "--value", str(tmp_path / "v.npy"), "--mask", str(tmp_path / "mask.json")]
    done = cli("attention", *args, "--causal", "bottom_right", "--local", "--json")
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    want = attention(
        q,
        k,
        v,
        mask=np.array([[True] * 4 + [False]] * 4),
        params=AttentionParams(causal="bottom_right"),
        dtype=np.float64,
    )
    np.testing.assert_allclose(got["weights"], want.weights, atol=1e-12)
    np.testing.assert_allclose(got["output"], want.output, atol=1e-12)
    assert got["engine"]["name"] == "numpy" and len(got["diagnostics"]["heads"]) == 2
    table = cli("attention", *args, "--causal", "bottom_right", "--local")
    assert table.returncode == 0, table.stderr
    assert "weights, batch 0 head 1" in table.stdout and "mean entropy" in table.stdout and "·" in table.stdout
    # the output itself, not only its shape: each head's rows with their values
    assert "output (2, 4, 3) float64" in table.stdout and "output, head 1" in table.stdout
    first = table.stdout.splitlines()[table.stdout.splitlines().index("output, head 0") + 2].split()
    np.testing.assert_allclose([float(x) for x in first[1:]], want.output[0, 0], atol=1e-4)


def test_softmax_rows_and_normalizers_local() -> None:
    done = cli(
        "softmax", "--scores", "2.1,0.5,-1.2,3.0;1.8,-0.3,2.5,0.1", "--normalizer", "sparsemax", "--local", "--json"
    )
    assert done.returncode == 0, done.stderr
    np.testing.assert_allclose(
        json.loads(done.stdout)["probabilities"], [[0.05, 0, 0, 0.95], [0.15, 0, 0.85, 0]], atol=1e-12
    )
    table = cli("softmax", "--scores", "2.1,0.5,-1.2,3.0;1.8,-0.3,2.5,0.1", "--normalizer", "relu", "--local")
    assert "row 0" in table.stdout and "row 1" in table.stdout and "0.5682" in table.stdout


def test_sample_local() -> None:
    done = cli("sample", "--logits", "2.1,0.5,-1.2,3.0", "--top-k", "2", "--seed", "7", "-n", "4", "--local", "--json")
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    np.testing.assert_allclose(got["probabilities"], [0.2891, 0, 0, 0.7109], atol=1e-4)
    assert len(got["tokens"]) == 4 and got["seed"] == 7
    table = cli("sample", "--logits", "2.1,0.5,-1.2,3.0", "--top-k", "2", "--seed", "7", "--local")
    assert table.returncode == 0 and "final distribution" in table.stdout and "kept 2" in table.stdout
