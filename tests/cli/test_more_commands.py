"""``backward``, ``analyze`` and ``calibrate`` (against the golden cases, with ``--local`` and through the
client against a server, which must agree), and ``-`` for standard input (.npy, .npz, JSON, numbers).
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests import golden
from tests.cli.test_commands import cli
from tests.e2e.conftest import ROOT, LiveServer

pytestmark = pytest.mark.slow


def piped(data: bytes, *args: str) -> subprocess.CompletedProcess[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ATTN_", "ATTENTION_"))}
    return subprocess.run(
        [sys.executable, "-m", "service", *args], input=data, cwd=ROOT, env=env, capture_output=True, timeout=120
    )


def _npz(**arrays: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)  # type: ignore[arg-type]
    return buffer.getvalue()


def test_backward_matches_the_golden_gradients(tmp_path: Path, keyed_server: LiveServer) -> None:
    case = next(c for c in golden.load("backward") if "mask" not in c["request"])
    request = case["request"]
    np.savez(tmp_path / "in.npz", **{k: np.array(request[k]) for k in ("query", "key", "value", "grad_output")})
    npz = str(tmp_path / "in.npz")
    options = ["--normalizer", request.get("normalizer", "softmax"), "--precision", "float64"]
    if request.get("temperature") is not None:
        options += ["--temperature", str(request["temperature"])]
    if request.get("causal"):
        options += ["--causal", "true" if request["causal"] is True else request["causal"]]
    inputs = ["--query", npz, "--key", npz, "--value", npz, "--grad-output", f"{npz}:grad_output"]
    local = cli("backward", *inputs, *options, "--local", "--json")
    assert local.returncode == 0, local.stderr
    got = json.loads(local.stdout)
    for name in ("grad_query", "grad_key", "grad_value"):
        np.testing.assert_allclose(got[name], case["expected"][name], atol=golden.tolerance(request))
    remote = cli("backward", *inputs, *options, "--url", keyed_server.url, "--json")
    assert remote.returncode == 0, remote.stderr
    for name in ("grad_query", "grad_key", "grad_value"):
        np.testing.assert_allclose(json.loads(remote.stdout)[name], got[name], atol=1e-12)
    table = cli("backward", *inputs, *options, "--return", "grad_query,grad_scale,gradient_health", "--local")
    assert table.returncode == 0, table.stderr
    assert "grad_query (" in table.stdout and "grad_scale " in table.stdout and "gradient health" in table.stdout
    assert "grad_key" not in table.stdout


def test_analyze_sweeps_drawn_inputs(keyed_server: LiveServer) -> None:
    args = ["analyze", "--shape", "1,2,8,16", "--scales", "0.25,1", "--temperatures", "0.5,1,2", "--seed", "3"]
    local = cli(*args, "--local", "--json")
    assert local.returncode == 0, local.stderr
    sweep = json.loads(local.stdout)["sweep"]
    assert [(r["scale"], r["temperature"]) for r in sweep] == [(s, t) for s in (0.25, 1) for t in (0.5, 1, 2)]
    entropies = [r["mean_entropy"] for r in sweep if r["scale"] == 0.25]
    assert entropies == sorted(entropies), "a higher temperature spreads the weights"
    remote = cli(*args, "--url", keyed_server.url, "--json")
    assert remote.returncode == 0, remote.stderr
    for theirs, ours in zip(json.loads(remote.stdout)["sweep"], sweep, strict=True):  # same seed, same draw
        assert theirs == pytest.approx(ours)
    table = cli(*args, "--local")
    lines = table.stdout.splitlines()
    assert lines[0].split()[:3] == ["scale", "T", "E"] and len([ln for ln in lines if ln.startswith(" ")]) >= 6
    assert "seed 3" in table.stdout
    half = cli("analyze", "--query", "1,0;0,1", "--local")
    assert half.returncode == 2 and "both --query and --key" in half.stderr


def test_calibrate_matches_the_golden_temperature(tmp_path: Path, keyed_server: LiveServer) -> None:
    case = golden.load("calibrate")[0]
    request = case["request"]
    np.save(tmp_path / "logits.npy", np.array(request["logits"]))
    (tmp_path / "labels.json").write_text(json.dumps(request["labels"]))
    args = ["calibrate", "--logits", str(tmp_path / "logits.npy"), "--labels", str(tmp_path / "labels.json")]
    local = cli(*args, "--bins", str(request.get("bins", 15)), "--local", "--json")
    assert local.returncode == 0, local.stderr
    got = json.loads(local.stdout)
    assert got["temperature"] == pytest.approx(case["temperature"], abs=1e-5)
    assert got["ece"]["after"] == pytest.approx(case["ece"]["after"], abs=1e-5)
    remote = cli(*args, "--url", keyed_server.url, "--json")
    assert remote.returncode == 0 and json.loads(remote.stdout)["temperature"] == pytest.approx(got["temperature"])
    table = cli(*args, "--local")
    assert table.stdout.startswith(f"temperature {got['temperature']:.4f}") and "reliability after" in table.stdout
    inline = cli("calibrate", "--logits", "2,0;0,2;2,0", "--labels", "0,1,1", "--local", "--json")
    assert inline.returncode == 0 and json.loads(inline.stdout)["accuracy"] == pytest.approx(2 / 3)
    assert cli("calibrate", "--logits", "2,0;0,2", "--labels", "0,0.5", "--local").returncode == 2


def test_stdin_npy_npz_json_and_numbers() -> None:
    row = np.array([1.0, 0.5, 2.5, -0.1])
    want = [0.1557, 0.0945, 0.6980, 0.0518]
    buffer = io.BytesIO()
    np.save(buffer, row)
    for data in (buffer.getvalue(), b"[1.0, 0.5, 2.5, -0.1]\n", b"1.0,0.5,2.5,-0.1\n", _npz(scores=row)):
        done = piped(data, "softmax", "--scores", "-", "--local", "--json")
        assert done.returncode == 0, done.stderr.decode()
        np.testing.assert_allclose(json.loads(done.stdout)["probabilities"], want, atol=1e-4)
    wire = json.dumps({"shape": [2, 2], "dtype": "float32", "data": [1, 2, 3, 4]}).encode()
    done = piped(wire, "softmax", "--scores", "-", "--local", "--json")
    assert done.returncode == 0 and len(json.loads(done.stdout)["probabilities"]) == 2


def test_one_npz_on_stdin_feeds_several_options() -> None:
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 5, 4)), rng.standard_normal((2, 5, 2))
    data = _npz(query=q, key=k, value=v, other=v)
    done = piped(data, "attention", "--query", "-", "--key", "-", "--value=-:other", "--local", "--json")
    assert done.returncode == 0, done.stderr.decode()
    assert np.asarray(json.loads(done.stdout)["output"]).shape == (2, 3, 2)
    missing = piped(data, "attention", "--query", "-", "--key", "-", "--value=-:nope", "--local")
    assert missing.returncode == 2 and b"has no array 'nope'" in missing.stderr
    assert piped(b"", "softmax", "--scores", "-", "--local").returncode == 2
    assert b"is empty" in piped(b"  \n", "softmax", "--scores", "-", "--local").stderr
    garbage = piped(b"\x00\xff\x10binary", "softmax", "--scores", "-", "--local")
    assert garbage.returncode == 2 and b"neither .npy, .npz, JSON nor numbers" in garbage.stderr
