"""The flash graph (``softmax_flash_f32``: ONNX Runtime's ``MultiHeadAttention``, run tiled over the keys with an
online softmax) against the numpy reference: the same numbers within the ONNX parity tolerance (float32 1e-5), where
the online maximum matters too (rows whose scores are huge, rows whose largest score comes in a late key block),
every size the engine sends it (value heads of another size, one key, long keys), the temperature and scale folded
into the query; overflow refused as on numpy; and its working memory does not grow with ``L x S``.
"""

from __future__ import annotations

import numpy as np
import pytest

from service.core.attention import check_dims
from service.core.errors import NumericalError
from service.core.types import AttentionInputs, AttentionParams, AttentionTask
from service.engines import cost
from service.engines.numpy_engine import NumpyEngine
from service.engines.onnx_engine import OnnxEngine
from service.export import DEFAULT_MODELS_DIR

FLASH = "softmax_flash_f32"
TOL = 1e-5
LARGE_SCORES_TOL = 1e-3


@pytest.fixture(scope="module")
def engines() -> tuple[OnnxEngine, NumpyEngine]:
    onnx = OnnxEngine(DEFAULT_MODELS_DIR)
    onnx.start()
    numpy_engine = NumpyEngine()
    numpy_engine.start()
    assert onnx.ready, onnx.describe()
    return onnx, numpy_engine


def task(q: np.ndarray, k: np.ndarray, v: np.ndarray, **params: float) -> AttentionTask:
    return AttentionTask(
        inputs=AttentionInputs(query=q, key=k, value=v),
        params=AttentionParams(**params),  # type: ignore[arg-type]
        dtype=np.dtype(np.float32),
        need_weights=False,
        need_scores=False,
    )


def both(engines: tuple[OnnxEngine, NumpyEngine], t: AttentionTask) -> tuple[np.ndarray, np.ndarray]:
    onnx, numpy_engine = engines
    assert onnx.graph_for(t) == FLASH
    return onnx.run(t).output, numpy_engine.run(t).output


@pytest.mark.parametrize(
    ("B", "H", "L", "S", "E", "Ev", "params"),
    [
        (1, 1, 16, 1, 8, 8, {}),  # one key: every weight 1
        (2, 3, 20, 7, 8, 5, {"temperature": 0.7}),  # value heads of another size
        (1, 2, 16, 2048, 64, 64, {}),  # many key blocks
        (3, 2, 64, 100, 16, 16, {"scale": 0.9, "temperature": 2.5}),
        # near one-hot rows: scores ~1e3 carry ~1e3 * 2^-24 * sqrt(E) of rounding in either engine, so the
        # parity tests' large-score tolerance (1e-3) applies
        (1, 4, 40, 513, 32, 48, {"temperature": 1e-3}),
    ],
)
def test_the_flash_graph_gives_the_reference_numbers(
    engines: tuple[OnnxEngine, NumpyEngine], B: int, H: int, L: int, S: int, E: int, Ev: int, params: dict
) -> None:
    rng = np.random.default_rng(B * 1000 + S)
    q = rng.standard_normal((B, H, L, E)).astype(np.float32)
    k = rng.standard_normal((B, H, S, E)).astype(np.float32)
    v = rng.standard_normal((B, H, S, Ev)).astype(np.float32)
    got, want = both(engines, task(q, k, v, **params))
    assert got.shape == want.shape == (B, H, L, Ev) and got.dtype == np.float32
    tol = LARGE_SCORES_TOL if params.get("temperature", 1.0) < 0.01 else TOL
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


def test_the_online_maximum_a_huge_score_in_a_late_key_block(engines: tuple[OnnxEngine, NumpyEngine]) -> None:
    """Each row's largest score (about 1e4 above the others) sits in the last of many key blocks: the running
    maximum and sum must rescale what the earlier blocks added, or the row would overflow or lose its weight.
    """
    rng = np.random.default_rng(7)
    H, L, S, E = 2, 32, 4096, 16
    q = rng.standard_normal((1, H, L, E)).astype(np.float32)
    k = rng.standard_normal((1, H, S, E)).astype(np.float32)
    v = rng.standard_normal((1, H, S, E)).astype(np.float32)
    k[0, :, -1] = q[0, :, 0] * 4e3 / float(np.dot(q[0, 0, 0], q[0, 0, 0]))  # row 0's last key: a score ~ 1e3
    k[0, :, -3] = 60 * q[0, :, 5] / float(np.linalg.norm(q[0, 0, 5]))  # row 5: a clear winner, late
    got, want = both(engines, task(q, k, v))
    np.testing.assert_allclose(got, want, rtol=TOL, atol=LARGE_SCORES_TOL)  # scores ~1e3: as above
    np.testing.assert_allclose(got[0, 0, 0], v[0, 0, -1], atol=1e-3)  # row 0 is all on its last key


def test_scores_that_overflow_float32_are_refused_as_on_numpy(engines: tuple[OnnxEngine, NumpyEngine]) -> None:
    q = np.full((1, 1, 16, 4), 3e19, dtype=np.float32)
    k = np.full((1, 1, 8, 4), 3e19, dtype=np.float32)
    v = np.ones((1, 1, 8, 4), dtype=np.float32)
    t = task(q, k, v)
    onnx, numpy_engine = engines
    assert onnx.graph_for(t) == FLASH
    with pytest.raises(NumericalError):
        numpy_engine.run(t)
    with pytest.raises(NumericalError):
        onnx.run(t)


def test_its_estimate_holds_no_scores() -> None:
    """The cost model prices the flash graph's peak as its result alone: no byte per score, so a (1, 8, 16384,
    64) request costs what its output does, where the Attention operator's graph would hold 8.6 GB of scores.
    """
    dims = check_dims((1, 8, 16384, 64), (1, 8, 16384, 64), (1, 8, 16384, 64))
    flash = cost.REFERENCE.onnx_cost(FLASH, dims, dtype="float32", need_weights=False, need_scores=False)
    output = 8 * 16384 * 64 * 4
    assert flash.peak_bytes == output + cost.FIXED_BYTES
    fused = cost.REFERENCE.onnx_cost(
        "softmax_fused_nomask_f32", dims, dtype="float32", need_weights=False, need_scores=False
    )
    assert fused.peak_bytes > 8 * 16384 * 16384 * 4
