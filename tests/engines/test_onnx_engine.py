"""The ONNX engine's life cycle: start-up checks, providers, graph choice, reporting, threads."""

from __future__ import annotations

import hashlib
import json
import logging
import re
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from service.core.attention import check_dims
from service.core.errors import InvalidInput, NumericalError
from service.core.types import AttentionInputs, AttentionParams, AttentionTask
from service.engines.base import Engine
from service.engines.dispatch import EngineDispatcher, EngineNotReady
from service.engines.numpy_engine import NumpyEngine
from service.engines.onnx_engine import PREFERRED_PROVIDERS, OnnxEngine, choose_providers, verify_models
from service.engines.onnx_engine.forward import forward_result
from service.export import DEFAULT_MODELS_DIR, MANIFEST_NAME


@pytest.fixture(scope="module")
def engine() -> OnnxEngine:
    e = OnnxEngine(DEFAULT_MODELS_DIR)
    e.start()
    assert e.ready, e.describe()
    return e


def task(
    normalizer: str = "softmax",
    *,
    alpha: float | None = None,
    dtype: str = "float32",
    need_weights: bool = True,
    need_scores: bool = False,
    seed: int = 0,
    masked: bool = True,
) -> AttentionTask:
    rng = np.random.default_rng(seed)
    return AttentionTask(
        inputs=AttentionInputs(
            query=rng.standard_normal((2, 4, 5, 8)),
            key=rng.standard_normal((2, 2, 6, 8)),
            value=rng.standard_normal((2, 2, 6, 3)),
            mask=rng.random((2, 1, 5, 6)) > 0.2 if masked else None,
        ),
        params=AttentionParams(normalizer=normalizer, alpha=alpha, causal="bottom_right" if masked else None),
        dtype=np.dtype(dtype),
        need_weights=need_weights,
        need_scores=need_scores,
    )


def copy_models(tmp_path: Path) -> Path:
    out = tmp_path / "models"
    shutil.copytree(DEFAULT_MODELS_DIR, out)
    return out


# ------------------------------------------------------------------------------ start-up


def test_engine_implements_the_protocol_and_is_ready_after_start(engine: OnnxEngine) -> None:
    assert isinstance(engine, Engine)
    assert engine.ready
    assert engine.provider == "CPUExecutionProvider"
    manifest = json.loads((DEFAULT_MODELS_DIR / MANIFEST_NAME).read_text())
    d = engine.describe()
    json.dumps(d)  # JSON-ready
    assert d["name"] == "onnx" and d["ready"] is True and d["error"] is None
    assert d["onnxruntime_version"] == ort.__version__
    assert d["available_providers"] == ort.get_available_providers()
    assert d["active_providers"][0] == "CPUExecutionProvider"
    assert set(d["graphs"]) == {g["name"] for g in manifest["graphs"]}
    for timing in d["graphs"].values():
        assert timing["warmup_ms"] > 0 and timing["load_ms"] > 0


def test_not_ready_before_start() -> None:
    e = OnnxEngine(DEFAULT_MODELS_DIR)
    assert not e.ready
    assert "not started" in e.unsupported_reason(task())
    assert e.describe()["ready"] is False
    with pytest.raises(RuntimeError, match="not started"):
        e.run(task())


def test_start_is_idempotent(engine: OnnxEngine) -> None:
    sessions = dict(engine._sessions)
    engine.start()
    assert engine._sessions == sessions


def test_models_lists_the_verified_manifest(engine: OnnxEngine) -> None:
    m = engine.models()
    json.dumps(m)
    manifest = json.loads((DEFAULT_MODELS_DIR / MANIFEST_NAME).read_text())
    assert m["verified"] is True and m["error"] is None
    assert [g["name"] for g in m["models"]] == [g["name"] for g in manifest["graphs"]]
    assert not any("sha256" in g for g in m["models"]) and "models_dir" not in m  # no hash, no server path
    assert all(g["verified"] and g["timing"]["warmup_ms"] > 0 for g in m["models"])


def test_corrupted_model_file_makes_the_engine_not_ready(tmp_path: Path) -> None:
    models = copy_models(tmp_path)
    victim = models / "sparsemax_f32.onnx"
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x01
    victim.write_bytes(bytes(data))
    e = OnnxEngine(models)
    e.start()
    assert not e.ready and e.failed
    d = e.describe()
    assert "sparsemax_f32.onnx" in d["error"] and "corrupted" in d["error"] and "sha256" in d["error"]
    assert d["graphs"] == {}
    # what clients see names the file, not the folder or the hashes; the log detail has both
    digest = hashlib.sha256(victim.read_bytes()).hexdigest()
    shown = json.dumps([d, e.models(), e.not_ready_reason])
    assert str(tmp_path) not in shown and digest not in shown and "models_dir" not in shown
    detail = e.failure_detail or ""
    assert digest in detail and str(models) in detail
    assert "failed to start" in e.unsupported_reason(task())
    assert e.models()["verified"] is False

    # numpy keeps serving: auto falls back and says why; asking for onnx is a 503
    dispatcher = EngineDispatcher({"onnx": e, "numpy": NumpyEngine()}, small_task_scores=0)
    result, choice = dispatcher.run(task(), "auto")
    assert choice.name == "numpy" and "onnx is not ready" in choice.reason and "corrupted" in choice.reason
    assert result.output.shape == (2, 4, 5, 3)
    with pytest.raises(EngineNotReady, match="corrupted"):
        dispatcher.select(task(), "onnx")


def test_missing_model_file_and_missing_manifest(tmp_path: Path) -> None:
    models = copy_models(tmp_path)
    (models / "relu_f64.onnx").unlink()
    e = OnnxEngine(models)
    e.start()
    assert not e.ready and "relu_f64.onnx" in e.describe()["error"]
    assert "relu_f64.onnx" in (e.failure_detail or "") and str(tmp_path) not in e.describe()["error"]

    empty = tmp_path / "empty"
    empty.mkdir()
    e = OnnxEngine(empty)
    e.start()
    assert not e.ready and "manifest" in e.describe()["error"] and "missing" in e.describe()["error"]


def test_verify_models_returns_every_blob() -> None:
    manifest, blobs = verify_models(DEFAULT_MODELS_DIR)
    assert set(blobs) == {g["name"] for g in manifest["graphs"]}


def test_session_options_and_no_warmup(tmp_path: Path) -> None:
    e = OnnxEngine(
        DEFAULT_MODELS_DIR, providers=["cpu"], intra_op_threads=1, graph_optimization_level="basic", warmup=False
    )
    e.start()
    assert e.ready and e.provider == "CPUExecutionProvider"
    d = e.describe()
    assert (
        d["intra_op_threads"] == 1 and d["graph_optimization_level"] == "basic" and d["configured_providers"] == ["cpu"]
    )
    assert all(t["warmup_ms"] < 5 for t in d["graphs"].values())
    want = NumpyEngine().run(task())
    np.testing.assert_allclose(e.run(task()).output, want.output, atol=1e-5)
    with pytest.raises(ValueError, match="graph_optimization_level"):
        OnnxEngine(DEFAULT_MODELS_DIR, graph_optimization_level="max")


# ------------------------------------------------------------------------------ providers


def test_choose_providers_default_order() -> None:
    available = ["CPUExecutionProvider", "CUDAExecutionProvider", "AzureExecutionProvider", "TensorrtExecutionProvider"]
    chosen, warnings = choose_providers(available, None)
    assert chosen == ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]
    assert warnings == []
    assert choose_providers(["AzureExecutionProvider", "CPUExecutionProvider"], None)[0] == ["CPUExecutionProvider"]
    assert PREFERRED_PROVIDERS[-1] == "CPUExecutionProvider"


def test_choose_providers_configured_list() -> None:
    available = ["CUDAExecutionProvider", "CPUExecutionProvider", "DmlExecutionProvider"]
    chosen, warnings = choose_providers(available, ["dml", "CUDAExecutionProvider"])
    assert chosen == ["DmlExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]
    chosen, warnings = choose_providers(["CPUExecutionProvider"], ["cuda"])
    assert chosen == ["CPUExecutionProvider"]
    assert len(warnings) == 1 and "'cuda'" in warnings[0] and "not available" in warnings[0]


def test_unavailable_configured_provider_is_reported(caplog: pytest.LogCaptureFixture) -> None:
    e = OnnxEngine(DEFAULT_MODELS_DIR, providers=["TensorrtExecutionProvider"], warmup=False)
    with caplog.at_level(logging.WARNING, logger="service.engines.onnx"):
        e.start()
    assert e.ready and e.provider == "CPUExecutionProvider"
    assert e.describe()["provider_warnings"] and any("Tensorrt" in r.getMessage() for r in caplog.records)


# ------------------------------------------------------------------------------ graph choice


@pytest.mark.parametrize(
    ("kwargs", "graph"),
    [
        ({"need_weights": False}, "softmax_fused_f32"),
        ({"need_weights": False, "masked": False}, "softmax_fused_nomask_f32"),
        ({"need_weights": False, "masked": False, "dtype": "float64"}, "softmax_fused_nomask_f64"),
        ({"masked": False}, "softmax_fused_weights_f32"),
        ({}, "softmax_fused_weights_f32"),
        ({"need_scores": True}, "softmax_f32"),
        ({"dtype": "float64", "need_weights": False}, "softmax_fused_f64"),
        ({"dtype": "float64", "need_scores": True}, "softmax_f64"),
        ({"normalizer": "sparsemax", "need_weights": False}, "sparsemax_f32"),
        ({"normalizer": "entmax15"}, "entmax15_f32"),
        ({"normalizer": "entmax", "alpha": 1.5}, "entmax15_f32"),
        ({"normalizer": "entmax", "alpha": 2.0}, "sparsemax_f32"),
        ({"normalizer": "entmax", "alpha": 1.7, "dtype": "float64"}, "entmax_f64"),
        ({"normalizer": "relu"}, "relu_f32"),
    ],
)
def test_graph_for(engine: OnnxEngine, kwargs: dict, graph: str) -> None:
    t = task(**kwargs)
    assert engine.unsupported_reason(t) is None
    assert engine.graph_for(t) == graph


@pytest.mark.parametrize(
    ("heads", "q_len", "dtype", "graph"),
    [
        ((4, 4), 16, "float32", "softmax_flash_f32"),  # equal heads, at least FLASH_MIN_Q_LEN rows: the flash graph
        ((4, 4), 15, "float32", "softmax_fused_nomask_f32"),  # a short query: the Attention operator
        ((4, 4), 1, "float32", "softmax_fused_nomask_f32"),  # a decoding step
        ((4, 2), 64, "float32", "softmax_fused_nomask_f32"),  # grouped-query heads
        ((4, 4), 64, "float64", "softmax_fused_nomask_f64"),  # the kernel is float32 only
    ],
)
def test_the_flash_graph_serves_unmasked_output_only_float32_with_equal_heads(
    engine: OnnxEngine, heads: tuple[int, int], q_len: int, dtype: str, graph: str
) -> None:
    rng = np.random.default_rng(0)
    Hq, Hkv = heads
    t = AttentionTask(
        inputs=AttentionInputs(
            query=rng.standard_normal((1, Hq, q_len, 8)),
            key=rng.standard_normal((1, Hkv, 24, 8)),
            value=rng.standard_normal((1, Hkv, 24, 8)),
        ),
        params=AttentionParams(),
        dtype=np.dtype(dtype),
        need_weights=False,
        need_scores=False,
    )
    assert engine.graph_for(t) == graph
    masked = AttentionTask(
        inputs=AttentionInputs(query=t.inputs.query, key=t.inputs.key, value=t.inputs.value),
        params=AttentionParams(causal="bottom_right"),
        dtype=t.dtype,
        need_weights=False,
        need_scores=False,
    )
    assert engine.graph_for(masked) == f"softmax_fused_{dtype[0]}{dtype[-2:]}"  # masks: never the flash graph


def test_unsupported_reasons(engine: OnnxEngine) -> None:
    t = task()
    t.dtype = np.dtype(np.float16)
    assert engine.unsupported_reason(t) == "precision float16 has no ONNX graph (float32 and float64 only)"
    assert engine.graph_for(t) is None
    assert "alpha" in engine.unsupported_reason(task("entmax", alpha=None))


def test_invalid_input_is_rejected_like_numpy(engine: OnnxEngine) -> None:
    t = task()
    t.inputs.key = t.inputs.key[:, :1, :, :4]
    with pytest.raises(InvalidInput, match="E=4"):
        engine.run(t)
    t = task()
    t.inputs.key_lengths = np.array([1, 9])
    with pytest.raises(InvalidInput, match="key_lengths"):
        engine.run(t)


def test_runs_log_nothing(engine: OnnxEngine, capfd: pytest.CaptureFixture[str]) -> None:
    """No per-request ONNX Runtime warnings (e.g. the fused weights graph's shape warning)."""
    for kwargs in (
        {"need_weights": False},
        {"need_weights": False, "masked": False},
        {},
        {"need_scores": True},
        {"normalizer": "entmax", "alpha": 1.3},
    ):
        engine.run(task(**kwargs))
    assert capfd.readouterr().err == ""


def test_results_do_not_alias_between_runs(engine: OnnxEngine) -> None:
    a = engine.run(task(seed=1))
    a_out = a.output.copy()
    engine.run(task(seed=2))
    np.testing.assert_array_equal(a.output, a_out)


def test_concurrent_requests_share_sessions(engine: OnnxEngine) -> None:
    tasks = [
        task(n, alpha=1.7 if n == "entmax" else None, seed=i, need_scores=i % 2 == 0)
        for i, n in enumerate(["softmax", "sparsemax", "entmax15", "entmax", "relu"] * 4)
    ]
    want = [NumpyEngine().run(t) for t in tasks]
    with ThreadPoolExecutor(max_workers=4) as pool:
        got = list(pool.map(engine.run, tasks))
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g.output, w.output, atol=1e-5, rtol=1e-5)
        np.testing.assert_allclose(g.weights, w.weights, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    ("got", "says"),
    [
        (np.inf, "the attention output overflows float32 (a weighted mean of the values beyond 3.4e+38"),
        (np.nan, "the attention output is not finite: the scores overflow float32"),
    ],
)
def test_an_output_overflow_is_named_as_the_numpy_engine_names_it(got: float, says: str) -> None:
    """Issue 28 item 4: an infinite output from finite weights is the output's overflow, not the scores'."""
    q = np.ones((1, 2), dtype=np.float32)
    task = AttentionTask(AttentionInputs(q, q, q), AttentionParams(), np.float32, need_weights=False)
    dims = check_dims((1, 1, 1, 2), (1, 1, 1, 2), (1, 1, 1, 2))
    fetched = {"output": np.full((1, 1, 1, 2), got, dtype=np.float32)}
    with pytest.raises(NumericalError, match=re.escape(says)):
        forward_result(task, fetched, dims, None, np.ones((1, 1, 1), dtype=np.int64))
