"""The cost model behind the budgets: it covers every graph, and it is honest about what the engines use."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from service.core.attention import Dims
from service.engines import cost
from service.engines.cost import REFERENCE
from service.engines.onnx_engine import verify_models
from service.settings import Settings

ROOT = Path(__file__).resolve().parents[2]


def _graph_names() -> list[str]:
    manifest, _ = verify_models(Settings().models_dir)
    return [g["name"] for g in manifest["graphs"]]


def test_every_exported_graph_has_measured_costs() -> None:
    names = _graph_names()
    missing = [n for n in names if n not in cost.ONNX_NS_PER_SCORE or n not in cost.ONNX_BYTES_PER_SCORE]
    assert not missing, f"run `python -m bench costs` and add these graphs to service/engines/cost.py: {missing}"
    assert max(cost.ONNX_BYTES_PER_SCORE.values()) <= cost.ONNX_DEFAULT_BYTES_PER_SCORE
    assert max(cost.ONNX_NS_PER_SCORE.values()) <= cost.ONNX_DEFAULT_NS_PER_SCORE


def test_bisection_is_costed_by_its_steps() -> None:
    """A bisection step costs a pass with a fractional power: entmax with alpha 1.3 costs far more
    than the exact sort-based kernels, which alpha 1.5 and 2 use.
    """
    general = REFERENCE.normalizer_ns_per_score("entmax", 1.3, "float32")
    assert general >= cost.NUMPY_BISECT_STEPS * cost.NUMPY_NS_PER_BISECT_STEP
    assert REFERENCE.normalizer_ns_per_score("entmax", 1.5, "float32") == REFERENCE.normalizer_ns_per_score(
        "entmax15", None, "float32"
    )
    assert REFERENCE.normalizer_ns_per_score("entmax", 2.0, "float64") == REFERENCE.normalizer_ns_per_score(
        "sparsemax", None, "float64"
    )
    assert general > 20 * REFERENCE.normalizer_ns_per_score("softmax", None, "float32")


def test_the_issue_requests_are_costed_as_what_they_took() -> None:
    """(1, 1, 8192, 1) entmax alpha 1.3 ran 28 s: its estimate is tens of core-seconds, not 0.3 GFLOP.
    The same shape with sparsemax needs gigabytes on the ONNX primitive graph and little on numpy.
    """
    dims = Dims(B=1, Hq=1, Hkv=1, L=8192, S=8192, E=1, Ev=1)
    slow = REFERENCE.numpy_cost(
        dims, normalizer="entmax", alpha=1.3, dtype="float32", need_weights=False, need_scores=False
    )
    assert slow.seconds > 20
    sparse_onnx = REFERENCE.onnx_cost("sparsemax_f32", dims, dtype="float32", need_weights=False, need_scores=False)
    sparse_numpy = REFERENCE.numpy_cost(
        dims, normalizer="sparsemax", alpha=None, dtype="float32", need_weights=False, need_scores=False, workers=2
    )
    assert sparse_onnx.peak_bytes > 2 << 30
    assert sparse_numpy.peak_bytes < 128 << 20


@pytest.mark.slow
@pytest.mark.parametrize(
    ("engine", "normalizer", "alpha", "dtype", "weights"),
    [
        ("onnx", "softmax", None, "float32", True),
        ("onnx", "sparsemax", None, "float32", True),
        ("onnx", "entmax15", None, "float64", True),
        ("onnx", "relu", None, "float32", True),
        ("numpy", "entmax", 1.3, "float32", False),
    ],
)
def test_measured_peak_memory_stays_under_the_model(
    engine: str, normalizer: str, alpha: float | None, dtype: str, weights: bool
) -> None:
    """One request (4M scores on ONNX, 1M on numpy) in a fresh process: its measured peak (VmHWM) is at
    most the model's, and with ONNX Runtime's arena off and the heap trimmed after a large run, the
    memory goes back: what stays is a fraction of the peak.
    """
    from bench.bench_costs import measure

    H, S, E = (4 if engine == "onnx" else 1), 1024, 16
    spec = {
        "shape": [1, H, S, S, E],
        "dtype": dtype,
        "normalizer": normalizer,
        "alpha": alpha,
        "engine": engine,
        "weights": weights,
        "masked": True,
        "models_dir": str(Settings().models_dir),
    }
    got = measure(spec)
    dims = Dims(B=1, Hq=H, Hkv=H, L=S, S=S, E=E, Ev=E)
    model = REFERENCE.estimate(
        engine,
        dims,
        normalizer=normalizer,
        alpha=alpha,
        dtype=dtype,
        need_weights=weights,
        need_scores=False,
        graph=got["graph"],
        workers=2,
    )
    assert int(got["peak_extra"]) <= model.peak_bytes, json.dumps(got)
    assert int(got["kept_after"]) <= max(model.peak_bytes // 4, 16 << 20), json.dumps(got)


def test_bench_costs_script_is_importable() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bench", "costs", "--help"], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert out.returncode == 0 and "--scores" in out.stdout


def test_near_one_entmax_costs_more_on_both_engines() -> None:
    """Below alpha - 1 = NEAR_ONE both engines take the log1p form, which the budgets must price."""
    dims = Dims(B=1, Hq=4, Hkv=4, L=32, S=512, E=64, Ev=64)
    assert REFERENCE.normalizer_ns_per_score("entmax", 1 + 1e-9, "float32") > REFERENCE.normalizer_ns_per_score(
        "entmax", 1.3, "float32"
    )
    kw = {"dtype": "float32", "need_weights": True, "need_scores": False}
    near = REFERENCE.onnx_cost("entmax_f32", dims, alpha=1 + 1e-9, **kw)
    far = REFERENCE.onnx_cost("entmax_f32", dims, alpha=1.3, **kw)
    assert near.seconds > far.seconds and near.peak_bytes == far.peak_bytes
    assert REFERENCE.onnx_cost("softmax_f32", dims, alpha=1 + 1e-9, **kw) == REFERENCE.onnx_cost(
        "softmax_f32", dims, **kw
    )


def test_a_model_scales_each_kernel_by_its_own_factor() -> None:
    """Calibration factors price a model's requests alone: the reference model, and any other, keep their own."""
    dims = Dims(B=1, Hq=1, Hkv=1, L=512, S=512, E=1, Ev=1)
    kw = {"alpha": None, "dtype": "float32", "need_weights": False, "need_scores": False}
    slow = cost.CostModel({"sparsemax": 4.0})
    assert (
        slow.numpy_cost(dims, normalizer="sparsemax", **kw).seconds
        > 3 * REFERENCE.numpy_cost(dims, normalizer="sparsemax", **kw).seconds
    )
    assert slow.numpy_cost(dims, normalizer="softmax", **kw) == REFERENCE.numpy_cost(dims, normalizer="softmax", **kw)
    assert REFERENCE.factors == {} and cost.CostModel(None).factor("gemm") == 1.0
    with pytest.raises(ValueError, match="calibration factors are 'gemm'"):
        cost.CostModel({"sparsemax": 0.0})
    with pytest.raises(ValueError, match="calibration factors are 'gemm'"):
        cost.CostModel({"quicksort": 2.0})
