"""The training-health analysis: the directions the 1/sqrt(d_k) argument predicts, on Gaussian Q and K."""

from __future__ import annotations

import math

import numpy as np
import pytest

from service.core import normalizers
from service.core.analysis import analyze, draw_normal, sweep_points
from service.core.backward import jacobian_norms
from service.core.errors import InvalidInput

HEAD_DIMS = (16, 64, 256, 1024)


@pytest.fixture(scope="module")
def table() -> dict[tuple[int, str], object]:
    out = {}
    for e in HEAD_DIMS:
        q, k = draw_normal((1, 2, 64, e), seed=1234)
        unscaled, scaled = analyze(q, k, points=sweep_points([e], None, [1.0]))
        out[(e, "unscaled")], out[(e, "scaled")] = unscaled, scaled
    return out


def test_unscaled_score_std_grows_like_sqrt_dk_and_scaled_stays_near_1(table) -> None:
    for e in HEAD_DIMS:
        assert table[(e, "unscaled")].scale == 1.0 and table[(e, "scaled")].scale == pytest.approx(1 / math.sqrt(e))
        assert table[(e, "unscaled")].score_std == pytest.approx(math.sqrt(e), rel=0.05)
        assert table[(e, "scaled")].score_std == pytest.approx(1.0, rel=0.05)
        assert table[(e, "unscaled")].score_range > table[(e, "scaled")].score_range


def test_unscaled_saturation_grows_with_dk_and_scaled_stays_flat(table) -> None:
    sat = [table[(e, "unscaled")].saturated_fraction for e in HEAD_DIMS]
    vanish = [table[(e, "unscaled")].vanishing_fraction for e in HEAD_DIMS]
    entropy = [table[(e, "unscaled")].mean_entropy for e in HEAD_DIMS]
    assert sat == sorted(sat) and sat[0] == 0 and sat[-1] > 0.1
    assert vanish == sorted(vanish) and vanish[-1] > 0.3
    assert entropy == sorted(entropy, reverse=True)
    assert table[(1024, "unscaled")].mean_jacobian_norm < table[(64, "unscaled")].mean_jacobian_norm / 2
    scaled = [table[(e, "scaled")] for e in HEAD_DIMS]
    assert all(r.saturated_fraction == 0 and r.vanishing_fraction == 0 for r in scaled)
    assert max(r.mean_normalized_entropy for r in scaled) - min(r.mean_normalized_entropy for r in scaled) < 0.05


def test_temperature_divides_the_scores_and_smooths_the_weights() -> None:
    q, k = draw_normal((2, 2, 16, 32), seed=7)
    rows = analyze(q, k, points=sweep_points([32], [1.0], [0.5, 1.0, 2.0]))
    assert [r.temperature for r in rows] == [0.5, 1.0, 2.0]
    assert rows[0].score_std == pytest.approx(2 * rows[1].score_std, rel=1e-12)
    assert rows[2].score_std == pytest.approx(rows[1].score_std / 2, rel=1e-12)
    assert rows[0].mean_entropy < rows[1].mean_entropy < rows[2].mean_entropy
    assert rows[0].saturated_fraction >= rows[1].saturated_fraction >= rows[2].saturated_fraction
    assert all(r.rows == 2 * 2 * 16 for r in rows)


def test_one_row_by_hand() -> None:
    """Two query rows against three keys: the statistics are the definitions applied to the scores."""
    q = np.array([[1.0, 0.0], [0.0, 2.0]])
    k = np.array([[1.0, 1.0], [0.5, -1.0], [2.0, 0.0]])
    (row,) = analyze(q, k, points=sweep_points([2], [0.5], [2.0]))
    z = 0.5 * q @ k.T / 2.0
    p = normalizers.softmax(z)
    h = -(p * np.log(p)).sum(-1)
    assert row.score_std == pytest.approx(z.std(), abs=1e-15)
    assert row.score_range == pytest.approx((z.max(-1) - z.min(-1)).mean(), abs=1e-15)
    assert row.mean_entropy == pytest.approx(h.mean(), abs=1e-15)
    assert row.mean_normalized_entropy == pytest.approx((h / math.log(3)).mean(), abs=1e-15)
    assert row.mean_jacobian_norm == pytest.approx(jacobian_norms("softmax", p).mean(), abs=1e-15)
    assert row.saturated_fraction == 0 and row.vanishing_fraction == 0 and row.rows == 2


@pytest.mark.parametrize("normalizer,alpha", [("sparsemax", None), ("entmax15", None), ("entmax", 1.3), ("relu", None)])
def test_masks_and_other_normalizers(normalizer: str, alpha: float | None) -> None:
    q, k = draw_normal((2, 2, 4, 8), seed=3)
    mask = np.zeros((1, 1, 4, 4))
    mask[..., 3] = -np.inf
    (row,) = analyze(
        q,
        k,
        points=sweep_points([8], [1.0], [1.0]),
        normalizer=normalizer,
        alpha=alpha,
        mask=mask,
        causal="top_left",
        key_lengths=np.array([4, 2]),
    )
    # informative rows (>= 2 valid keys): batch 0 rows 1, 2, 3; batch 1 rows 1, 2, 3 (keys 0 and 1); two heads each
    assert row.rows == 12
    assert 0 <= row.vanishing_fraction <= 1 and math.isfinite(row.mean_jacobian_norm)
    assert 0 <= row.mean_normalized_entropy <= 1 + 1e-12


def test_sparse_normalizers_saturate_exactly() -> None:
    """Unscaled sparsemax on d_k = 256 puts all weight on one key in most rows: its Jacobian there is exactly 0."""
    q, k = draw_normal((1, 1, 32, 256), seed=0)
    unscaled, scaled = analyze(q, k, points=sweep_points([256], None, [1.0]), normalizer="sparsemax")
    assert unscaled.vanishing_fraction > 0.5 and unscaled.saturated_fraction == unscaled.vanishing_fraction
    assert scaled.vanishing_fraction < unscaled.vanishing_fraction


def test_head_dim_must_match() -> None:
    q, k = draw_normal((1, 1, 2, 4), seed=0)
    with pytest.raises(InvalidInput):
        analyze(q, k, points=sweep_points([8], None, [1.0]))
