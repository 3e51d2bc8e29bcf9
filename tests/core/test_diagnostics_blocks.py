"""service.core.diagnostics: the numpy path's one pass over inputs that fit a block gives, bit for bit, what the
blocked path gives (but the score statistics, whose blocks are merged with Chan's update).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.core import diagnostics as diag
from service.core.diagnostics import report, rows


def _same(a: Any, b: Any, where: str = "") -> None:
    """Equal types and values, arrays byte for byte (so -0.0 and 0.0 differ)."""
    assert type(a) is type(b), where
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            _same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same(x, y, f"{where}[{i}]")
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes(), where
    else:
        assert repr(a) == repr(b), where


def _weights(seed: int, shape: tuple[int, int, int, int], dtype: type, dead: float) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    z = rng.standard_normal(shape) * 4
    keep = rng.random(shape) >= dead
    e = np.where(keep, np.exp(z - z.max(-1, keepdims=True)), 0.0)
    total = e.sum(-1, keepdims=True)
    w = np.divide(e, total, out=np.zeros_like(e), where=total > 0).astype(dtype)
    return w, keep.sum(-1)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    shape=st.tuples(st.integers(1, 3), st.integers(1, 3), st.integers(1, 9), st.integers(1, 9)),
    dtype=st.sampled_from([np.float32, np.float64]),
    dead=st.sampled_from([0.0, 0.3, 0.95]),
    causal=st.sampled_from([None, "top_left", "bottom_right"]),
    nan=st.booleans(),
)
def test_one_pass_equals_blocks(
    seed: int, shape: tuple[int, int, int, int], dtype: type, dead: float, causal: str | None, nan: bool
) -> None:
    w, valid = _weights(seed, shape, dtype, dead)
    if nan:
        w[..., 0, 0] = np.nan
    scores = np.where(w > 0, np.log(np.where(w > 0, w, 1)), -np.inf).astype(dtype)
    output = np.ones(shape[:3] + (2,), dtype)
    saved, saved_small = rows.BLOCK_ELEMENTS, report._SMALL_WORK
    report._SMALL_WORK = 0  # the numpy path whatever the size (test_diagnostics_small compares the list path)
    try:
        one_pass = diag.attention_diagnostics(w, valid, scores=scores, output=output, causal=causal)
        probs = diag.probability_diagnostics(w.reshape(-1, shape[-1]))
        rows.BLOCK_ELEMENTS = 3  # every row its own block: the general path
        blocked = diag.attention_diagnostics(w, valid, scores=scores, output=output, causal=causal)
        probs_blocked = diag.probability_diagnostics(w.reshape(-1, shape[-1]))
    finally:
        rows.BLOCK_ELEMENTS, report._SMALL_WORK = saved, saved_small
    # score statistics merge blocks with Chan's update, which rounds differently by design: toleranced
    stats, stats_blocked = one_pass.pop("score_stats"), blocked.pop("score_stats")
    assert (stats is None) == (stats_blocked is None)
    if stats is not None:
        assert stats == pytest.approx(stats_blocked, rel=1e-12, abs=1e-300)
    _same(one_pass, blocked)
    _same(probs, probs_blocked)


def test_cached_tables_are_read_only() -> None:
    """Query positions and distance tables are shared between calls: nobody may write into them."""
    positions = report.query_positions(4, 2)
    with pytest.raises(ValueError):
        positions[0] = 1.0
    with pytest.raises(ValueError):
        rows.distances(positions, 5)[0, 0] = 1.0
    np.testing.assert_array_equal(rows.distances(positions, 5)[1], [3, 2, 1, 0, 1])
