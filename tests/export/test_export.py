"""The exported graphs: deterministic export, manifest hashes, valid ONNX that onnxruntime loads."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import onnx
import pytest

from service.export import DEFAULT_MODELS_DIR, MANIFEST_NAME, export_models, main
from service.export.builder import IR_VERSION, OPSET
from service.export.graphs import GRAPHS

COMMITTED = DEFAULT_MODELS_DIR


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("models")
    export_models(out)
    return out


@pytest.fixture(scope="module")
def manifest() -> dict:
    return json.loads((COMMITTED / MANIFEST_NAME).read_text())


def test_fresh_export_equals_committed_models_byte_for_byte(fresh: Path) -> None:
    fresh_files = sorted(p.name for p in fresh.iterdir())
    committed_files = sorted(p.name for p in COMMITTED.iterdir() if p.suffix in (".onnx", ".json"))
    assert fresh_files == committed_files, "models/ is stale: run `python -m service.export` and commit models/"
    for name in fresh_files:
        assert (fresh / name).read_bytes() == (COMMITTED / name).read_bytes(), (
            f"models/{name} differs from a fresh export: run `python -m service.export` and commit models/"
        )


def test_export_twice_is_byte_identical(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    export_models(a)
    export_models(b)
    for p in sorted(a.iterdir()):
        assert p.read_bytes() == (b / p.name).read_bytes(), p.name


def test_main_writes_the_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--out", str(tmp_path)]) == 0
    assert (tmp_path / MANIFEST_NAME).exists()
    assert f"wrote {len(GRAPHS)} graphs" in capsys.readouterr().out


def test_manifest_hashes_match_the_files(manifest: dict) -> None:
    assert manifest["opset"] == OPSET and manifest["ir_version"] == IR_VERSION
    names = [g["name"] for g in manifest["graphs"]]
    assert names == [s.name for s in GRAPHS]
    for g in manifest["graphs"]:
        data = (COMMITTED / g["file"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == g["sha256"], g["file"]
        assert len(data) == g["bytes"]


@pytest.mark.parametrize("spec", GRAPHS, ids=lambda s: s.name)
def test_graph_is_valid_onnx_and_matches_its_manifest_entry(spec, manifest: dict) -> None:
    entry = next(g for g in manifest["graphs"] if g["name"] == spec.name)
    model = onnx.load(COMMITTED / entry["file"])
    onnx.checker.check_model(model, full_check=True)
    # onnxruntime 1.31 refuses IR 14, the default of onnx >= 1.23
    assert model.ir_version == IR_VERSION == 10
    ops = {n.op_type for n in model.graph.node}
    contrib = [("com.microsoft", 1)] if "MultiHeadAttention" in ops else []  # ONNX Runtime's contributed operator
    assert [(o.domain, o.version) for o in model.opset_import] == [("", OPSET), *contrib]
    assert [i.name for i in model.graph.input] == [i["name"] for i in entry["inputs"]]
    assert [o.name for o in model.graph.output] == [o["name"] for o in entry["outputs"]]
    assert [o["name"] for o in entry["outputs"]] == entry["supports"]["outputs"]
    assert ("Attention" in ops or "MultiHeadAttention" in ops) == spec.fused
    if not spec.fused:
        assert "scores" in entry["supports"]["outputs"]
    assert entry["supports"]["dtype"] == spec.dtype
    inputs = {i["name"] for i in entry["inputs"]}
    if spec.masked:
        assert {"keep_mask", "bias"} <= inputs
        assert set(entry["supports"]["causal"]) == {"top_left", "bottom_right"}
    else:
        assert not inputs & {"keep_mask", "bias"} and entry["supports"]["causal"] == []


def test_every_normalizer_and_dtype_has_a_graph(manifest: dict) -> None:
    have = {(g["supports"]["normalizer"], g["supports"]["dtype"]) for g in manifest["graphs"]}
    for normalizer in ("softmax", "sparsemax", "entmax15", "entmax", "relu"):
        for dtype in ("float32", "float64"):
            assert (normalizer, dtype) in have
    fused_output_only = [
        g for g in manifest["graphs"] if g["supports"]["fused_attention_op"] and not g["supports"]["weights"]
    ]
    assert {g["supports"]["dtype"] for g in fused_output_only} == {"float32", "float64"}
