"""Tests of service.core.diagnostics against hand-computed values (docs/concepts/diagnostics.md), on both paths."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest

from service.core.diagnostics import (
    DiagnosticThresholds,
    attention_diagnostics,
    probability_diagnostics,
    report,
    rows,
)

REFERENCE_ROWS = np.array([[1.0, 0.5, 2.5, -0.1], [2.1, 0.5, -1.2, 3.0], [1.8, -0.3, 2.5, 0.1]], dtype=np.float64)
REFERENCE_ENTROPIES = [0.9169, 0.8296, 0.9460]
ROW_KEYS = (
    "entropy",
    "normalized_entropy",
    "max_weight",
    "argmax",
    "effective_support",
    "zeros",
    "attention_distance",
)


@pytest.fixture(autouse=True, params=["list", "numpy"])
def diagnostics_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test runs on both paths of attention_diagnostics: the list path of small inputs and the numpy one."""
    monkeypatch.setattr(report, "_SMALL_WORK", 1 << 40 if request.param == "list" else 0)


def plain_softmax(z: np.ndarray) -> np.ndarray:
    """Softmax over the last axis with nothing but exp and sum."""
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def as4d(rows: list[list[float]] | np.ndarray) -> np.ndarray:
    """Rows ``(L, S)`` as weights ``(1, 1, L, S)``."""
    return np.asarray(rows, dtype=np.float64)[None, None]


def assert_all_finite(result: dict[str, Any]) -> None:
    """Every number in the result is finite and the whole thing is strict JSON."""

    def default(o: Any) -> Any:
        if isinstance(o, np.ndarray):
            assert np.isfinite(o).all(), o
            return o.tolist()
        raise TypeError(type(o))

    json.dumps(result, default=default, allow_nan=False)


# --------------------------------------------------------------------------
# Per-row quantities
# --------------------------------------------------------------------------


@pytest.mark.parametrize("n", [2, 3, 7])
def test_uniform_row_over_valid_keys(n: int) -> None:
    s = 9
    row = np.zeros(s)
    row[:n] = 1.0 / n
    r = attention_diagnostics(as4d([row]), np.array([[[n]]]))
    assert r["entropy"][0, 0, 0] == pytest.approx(math.log(n), rel=1e-12)
    assert r["normalized_entropy"][0, 0, 0] == pytest.approx(1.0, rel=1e-12)
    assert r["effective_support"][0, 0, 0] == pytest.approx(n, rel=1e-12)
    assert r["max_weight"][0, 0, 0] == pytest.approx(1.0 / n)
    assert r["argmax"][0, 0, 0] == 0
    assert r["zeros"][0, 0, 0] == 0  # the s - n zeros are masked keys, not sparsity
    assert r["saturated_rows"] == 0
    assert r["fully_masked_rows"] == 0


def test_uniform_row_float32() -> None:
    n = 512
    w = np.full((1, 1, 1, n), 1.0 / n, dtype=np.float32)
    r = attention_diagnostics(w, np.array([[[n]]]))
    assert r["entropy"][0, 0, 0] == pytest.approx(math.log(n), rel=1e-6)
    assert r["normalized_entropy"][0, 0, 0] == pytest.approx(1.0, rel=1e-6)
    assert r["effective_support"][0, 0, 0] == pytest.approx(n, rel=1e-5)


def test_one_hot_row() -> None:
    r = attention_diagnostics(as4d([[0.0, 0.0, 1.0, 0.0]]), np.array([[[4]]]))
    assert r["entropy"][0, 0, 0] == 0.0
    assert r["normalized_entropy"][0, 0, 0] == 0.0
    assert r["effective_support"][0, 0, 0] == 1.0
    assert r["max_weight"][0, 0, 0] == 1.0
    assert r["argmax"][0, 0, 0] == 2
    assert r["zeros"][0, 0, 0] == 3
    assert r["saturated_rows"] == 1
    assert r["row_sum_max_error"] == 0.0


def test_single_valid_key_is_not_saturated_and_has_zero_normalized_entropy() -> None:
    r = attention_diagnostics(as4d([[1.0, 0.0, 0.0]]), np.array([[[1]]]))
    assert r["saturated_rows"] == 0
    assert r["normalized_entropy"][0, 0, 0] == 0.0
    assert r["zeros"][0, 0, 0] == 0
    assert r["heads"][0]["informative_rows"] == 0
    assert r["heads"][0]["live_rows"] == 1


def test_saturation_margin_boundary() -> None:
    # max weight 1 - 2**-20 (about 1 - 9.5e-7): saturated for margin 1e-6, not for 2**-20.
    top = 1.0 - 2.0**-20
    w = as4d([[top, 1.0 - top, 0.0]])
    assert attention_diagnostics(w, np.array([[[3]]]))["saturated_rows"] == 1
    t = DiagnosticThresholds(saturation_margin=2.0**-20)
    assert attention_diagnostics(w, np.array([[[3]]]), thresholds=t)["saturated_rows"] == 0


def test_reference_softmax_entropies() -> None:
    p = plain_softmax(REFERENCE_ROWS)
    r = attention_diagnostics(p[None, None], np.full((1, 1, 3), 4))
    np.testing.assert_allclose(r["entropy"][0, 0], REFERENCE_ENTROPIES, atol=5e-5)
    np.testing.assert_allclose(r["normalized_entropy"][0, 0], np.array(REFERENCE_ENTROPIES) / math.log(4), atol=5e-5)
    np.testing.assert_allclose(r["effective_support"][0, 0], np.exp(REFERENCE_ENTROPIES), rtol=1e-4)
    assert r["argmax"][0, 0].tolist() == [2, 3, 2]
    np.testing.assert_allclose(r["max_weight"][0, 0], [0.6980, 0.6650, 0.6068], atol=5e-5)
    assert r["zeros"][0, 0].tolist() == [0, 0, 0]
    # float32 weights give the same numbers to float32 accuracy
    r32 = attention_diagnostics(p.astype(np.float32)[None, None], np.full((1, 1, 3), 4))
    np.testing.assert_allclose(r32["entropy"], r["entropy"], rtol=1e-6)


def test_sparsemax_zeros_count_exact_zeros_among_valid_keys() -> None:
    # the contract's reference sparsemax rows; the last key of every row is masked (valid_keys 3)
    w = as4d([[0.0, 0.0, 1.0, 0.0], [0.05, 0.0, 0.0, 0.95], [0.15, 0.0, 0.85, 0.0]])
    r = attention_diagnostics(w, np.array([[[4, 4, 3]]]))
    assert r["zeros"][0, 0].tolist() == [3, 2, 1]


def test_attention_distance_top_left_and_bottom_right() -> None:
    # L=2 queries, S=4 keys, uniform weights: distance = mean_j |pos_i - j|.
    w = np.full((1, 1, 2, 4), 0.25)
    vk = np.array([[[4, 4]]])
    top = attention_diagnostics(w, vk, causal="top_left")["attention_distance"][0, 0]
    none = attention_diagnostics(w, vk)["attention_distance"][0, 0]
    bottom = attention_diagnostics(w, vk, causal="bottom_right")["attention_distance"][0, 0]
    assert top.tolist() == [1.5, 1.0]  # pos 0: (0+1+2+3)/4, pos 1: (1+0+1+2)/4
    assert none.tolist() == top.tolist()
    assert bottom.tolist() == [1.0, 1.5]  # pos 2: (2+1+0+1)/4, pos 3: (3+2+1+0)/4


def test_attention_distance_with_causal_weights() -> None:
    # top_left: query 0 sees key 0, query 1 sees keys 0..1
    w_tl = np.array([[1.0, 0.0, 0.0, 0.0], [0.5, 0.5, 0.0, 0.0]])[None, None]
    r = attention_diagnostics(w_tl, np.array([[[1, 2]]]), causal="top_left")
    assert r["attention_distance"][0, 0].tolist() == [0.0, 0.5]
    # bottom_right: query 0 (position 2) sees keys 0..2, query 1 (position 3) all four
    w_br = np.array([[1 / 3, 1 / 3, 1 / 3, 0.0], [0.25, 0.25, 0.25, 0.25]])[None, None]
    r = attention_diagnostics(w_br, np.array([[[3, 4]]]), causal="bottom_right")
    np.testing.assert_allclose(r["attention_distance"][0, 0], [1.0, 1.5], rtol=1e-15)
    assert r["heads"][0]["mean_distance"] == pytest.approx(1.25)


def test_unknown_causal_is_rejected() -> None:
    with pytest.raises(ValueError, match="causal"):
        attention_diagnostics(np.full((1, 1, 1, 2), 0.5), np.array([[[2]]]), causal="lower")


# --------------------------------------------------------------------------
# Fully masked and relu zero-sum rows
# --------------------------------------------------------------------------


def test_fully_masked_rows_are_counted_and_zero() -> None:
    w = np.zeros((1, 2, 3, 4))
    w[0, 0, 0] = [0.25, 0.25, 0.25, 0.25]
    vk = np.zeros((1, 2, 3), dtype=np.int64)
    vk[0, 0, 0] = 4
    r = attention_diagnostics(w, vk, causal="bottom_right")
    assert r["fully_masked_rows"] == 5
    dead = np.ones((1, 2, 3), bool)
    dead[0, 0, 0] = False
    for key in ("entropy", "normalized_entropy", "max_weight", "effective_support", "zeros", "attention_distance"):
        assert (r[key][dead] == 0).all(), key
    assert (r["argmax"][dead] == -1).all()
    assert r["argmax"][0, 0, 0] == 0
    assert r["row_sum_max_error"] == 0.0
    assert r["saturated_rows"] == 0
    # head (0, 1) has no live row: means 0, flags False
    h = r["heads"][1]
    assert (h["batch"], h["head"]) == (0, 1)
    assert h["live_rows"] == 0 and h["informative_rows"] == 0
    assert h["mean_entropy"] == h["mean_normalized_entropy"] == h["mean_distance"] == 0.0
    assert h["collapsed"] is False and h["uniform"] is False
    # head (0, 0): means over its one live row only
    assert r["heads"][0]["mean_entropy"] == pytest.approx(math.log(4))
    assert r["heads"][0]["uniform"] is True
    assert_all_finite(r)


def test_everything_masked_gives_finite_zeros() -> None:
    r = attention_diagnostics(np.zeros((2, 2, 3, 5), np.float32), np.zeros((2, 2, 3), np.int64))
    assert r["fully_masked_rows"] == 12
    assert r["row_sum_max_error"] == 0.0
    assert r["non_finite"] == 0
    assert len(r["heads"]) == 4
    assert_all_finite(r)


def test_relu_zero_sum_rows_count_as_fully_masked() -> None:
    z = np.array([[2.1, 0.5, -1.2, 3.0], [-1.0, -2.0, -0.5, -3.0]])
    relu = np.maximum(z, 0.0)
    sums = relu.sum(axis=-1, keepdims=True)
    w = np.divide(relu, sums, out=np.zeros_like(relu), where=sums > 0)
    r = attention_diagnostics(w[None, None], np.array([[[4, 4]]]))
    assert r["fully_masked_rows"] == 1
    assert r["argmax"][0, 0].tolist() == [3, -1]
    assert r["entropy"][0, 0, 1] == 0.0
    assert r["effective_support"][0, 0, 1] == 0.0
    # all four valid keys of the dead row got an exact zero; row 0 has one
    assert r["zeros"][0, 0].tolist() == [1, 4]
    np.testing.assert_allclose(w[0], [0.375, 0.0893, 0.0, 0.5357], atol=5e-5)
    assert r["heads"][0]["live_rows"] == 1
    assert r["row_sum_max_error"] < 1e-15


# --------------------------------------------------------------------------
# Numerical health
# --------------------------------------------------------------------------


def test_row_sum_max_error_on_perturbed_weights() -> None:
    w = np.array([[0.25, 0.25, 0.25, 0.25], [0.5, 0.5 + 1e-3, 0.0, 0.0], [0.3, 0.3, 0.4 - 2e-4, 0.0], [0.0] * 4])
    r = attention_diagnostics(w[None, None], np.array([[[4, 4, 4, 0]]]))
    assert r["row_sum_max_error"] == pytest.approx(1e-3, rel=1e-9)
    assert r["fully_masked_rows"] == 1  # the all-zero row is not an error of 1


def test_non_finite_in_weights_and_output() -> None:
    w = np.full((1, 1, 2, 4), 0.25)
    w[0, 0, 1, 2] = np.nan
    out = np.ones((1, 1, 2, 3))
    out[0, 0, 0, 0] = np.nan
    out[0, 0, 1, 1] = np.inf
    out[0, 0, 1, 2] = -np.inf
    r = attention_diagnostics(w, np.array([[[4, 4]]]), output=out)
    assert r["non_finite"] == 4
    # the NaN counts as 0 elsewhere: row 1 is three keys at 0.25
    assert r["entropy"][0, 0, 1] == pytest.approx(-0.75 * math.log(0.25))
    assert r["row_sum_max_error"] == pytest.approx(0.25)
    assert r["zeros"][0, 0, 1] == 0
    assert_all_finite(r)
    assert attention_diagnostics(w, np.array([[[4, 4]]]))["non_finite"] == 1


def test_all_nan_row_is_finite_and_dead() -> None:
    w = np.full((1, 1, 1, 3), np.nan, dtype=np.float32)
    w32_inf = np.array([[[[np.inf, 0.0, 0.0]]]], dtype=np.float32)
    r = attention_diagnostics(w, np.array([[[3]]]))
    assert r["non_finite"] == 3 and r["fully_masked_rows"] == 1
    assert_all_finite(r)
    r = attention_diagnostics(w32_inf, np.array([[[3]]]))
    assert r["non_finite"] == 1 and r["fully_masked_rows"] == 1
    assert_all_finite(r)


def test_score_stats_ignore_minus_inf() -> None:
    w = np.array([[1 / 3, 1 / 3, 0.0, 1 / 3], [0.0] * 4])[None, None]
    scores = np.array([[1.0, 2.0, -np.inf, 3.0], [-np.inf] * 4])[None, None]
    r = attention_diagnostics(w, np.array([[[3, 0]]]), scores=scores)
    stats = r["score_stats"]
    assert stats == pytest.approx({"min": 1.0, "max": 3.0, "mean": 2.0, "std": math.sqrt(2 / 3), "count": 3})
    assert isinstance(stats["count"], int)
    assert attention_diagnostics(w, np.array([[[3, 0]]]))["score_stats"] is None
    all_masked = np.full((1, 1, 2, 4), -np.inf)
    assert attention_diagnostics(np.zeros((1, 1, 2, 4)), np.zeros((1, 1, 2)), scores=all_masked)["score_stats"] is None


def test_score_stats_many_blocks_and_huge_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rows, "BLOCK_ELEMENTS", 7)
    rng = np.random.default_rng(3)
    scores = rng.normal(5.0, 2.0, size=(2, 3, 4, 5))
    scores[0, 1, 2, :3] = -np.inf
    finite = scores[np.isfinite(scores)]
    w = np.full(scores.shape, 0.2)
    stats = attention_diagnostics(w, np.full((2, 3, 4), 5), scores=scores)["score_stats"]
    assert stats["count"] == finite.size
    assert stats["min"] == finite.min() and stats["max"] == finite.max()
    assert stats["mean"] == pytest.approx(finite.mean(), rel=1e-13)
    assert stats["std"] == pytest.approx(finite.std(), rel=1e-12)
    huge = np.array([1e300, -1e300, 1e300, 0.0]).reshape(1, 1, 1, 4)
    stats = attention_diagnostics(np.full((1, 1, 1, 4), 0.25), np.array([[[4]]]), scores=huge)["score_stats"]
    assert stats["mean"] == pytest.approx(0.25e300)
    assert stats["std"] == pytest.approx(np.std(huge / 1e300) * 1e300)
    assert all(math.isfinite(v) for v in stats.values())


# --------------------------------------------------------------------------
# Per-head flags
# --------------------------------------------------------------------------


def test_collapsed_flag_flips_exactly_at_thresholds() -> None:
    # 2 of 3 informative rows have max weight exactly 0.9
    w = as4d([[0.9, 0.1], [0.1, 0.9], [0.5, 0.5]])
    vk = np.array([[[2, 2, 2]]])

    def collapsed(**kw: float) -> bool:
        head = attention_diagnostics(w, vk, thresholds=DiagnosticThresholds(**kw))["heads"][0]
        return bool(head["collapsed"])

    assert attention_diagnostics(w, vk)["heads"][0]["collapsed_fraction"] == pytest.approx(2 / 3)
    assert collapsed() is True
    assert collapsed(collapsed_max_weight=0.9) is True  # max >= threshold counts
    assert collapsed(collapsed_max_weight=float(np.nextafter(0.9, 1.0))) is False
    assert collapsed(collapsed_row_fraction=2 / 3) is False  # strictly more than the fraction
    assert collapsed(collapsed_row_fraction=float(np.nextafter(2 / 3, 0.0))) is True


def test_uniform_flag_flips_exactly_at_threshold() -> None:
    w = as4d([[0.5, 0.3, 0.2], [0.4, 0.35, 0.25]])
    vk = np.array([[[3, 3]]])
    m = attention_diagnostics(w, vk)["heads"][0]["mean_normalized_entropy"]
    assert 0.9 < m < 1.0
    expected = np.mean([-(np.array(r) * np.log(r)).sum() / math.log(3) for r in ([0.5, 0.3, 0.2], [0.4, 0.35, 0.25])])
    assert m == pytest.approx(expected, rel=1e-14)

    def uniform(threshold: float) -> bool:
        t = DiagnosticThresholds(uniform_normalized_entropy=threshold)
        return bool(attention_diagnostics(w, vk, thresholds=t)["heads"][0]["uniform"])

    assert uniform(m) is True
    assert uniform(float(np.nextafter(m, 2.0))) is False
    assert uniform(0.95) is True  # default


def test_flags_ignore_rows_with_one_valid_key() -> None:
    # causal top_left, uniform over the visible keys: row 0 has a single key
    L = 4
    w = np.tril(np.ones((L, L))) / np.arange(1, L + 1)[:, None]
    r = attention_diagnostics(w[None, None], np.arange(1, L + 1)[None, None], causal="top_left")
    head = r["heads"][0]
    assert head["live_rows"] == 4 and head["informative_rows"] == 3
    assert head["mean_normalized_entropy"] == pytest.approx(1.0)
    assert head["uniform"] is True and head["collapsed"] is False
    assert head["mean_entropy"] == pytest.approx(sum(math.log(n) for n in range(1, L + 1)) / L)


def test_thresholds_are_validated() -> None:
    with pytest.raises(ValueError, match="collapsed_max_weight"):
        DiagnosticThresholds(collapsed_max_weight=0.0)
    with pytest.raises(ValueError, match="collapsed_row_fraction"):
        DiagnosticThresholds(collapsed_row_fraction=1.5)
    with pytest.raises(ValueError, match="uniform_normalized_entropy"):
        DiagnosticThresholds(uniform_normalized_entropy=1.01)
    with pytest.raises(ValueError, match="saturation_margin"):
        DiagnosticThresholds(saturation_margin=0.0)
    t = DiagnosticThresholds()
    assert (t.collapsed_max_weight, t.collapsed_row_fraction, t.uniform_normalized_entropy, t.saturation_margin) == (
        0.9,
        0.5,
        0.95,
        1e-6,
    )


def test_heads_order_and_length() -> None:
    B, H, L, S = 2, 3, 2, 8
    w = np.zeros((B, H, L, S))
    for b in range(B):
        for h in range(H):
            n = 3 * b + h + 2  # distinct uniform width per head
            w[b, h, :, :n] = 1.0 / n
    vk = np.full((B, H, L), S)
    r = attention_diagnostics(w, vk)
    heads = r["heads"]
    assert len(heads) == B * H
    assert [(d["batch"], d["head"]) for d in heads] == [(b, h) for b in range(B) for h in range(H)]
    for d in heads:
        n = 3 * d["batch"] + d["head"] + 2
        assert d["mean_entropy"] == pytest.approx(math.log(n))
        assert d["mean_normalized_entropy"] == pytest.approx(math.log(n) / math.log(S))
        assert isinstance(d["collapsed"], bool) and isinstance(d["uniform"], bool)
        assert isinstance(d["batch"], int) and isinstance(d["mean_entropy"], float)
    for key in ROW_KEYS:
        assert r[key].shape == (B, H, L), key
    assert r["argmax"].dtype == np.int64 and r["zeros"].dtype == np.int64
    assert r["entropy"].dtype == np.float64


# --------------------------------------------------------------------------
# Blocking, dtypes and shapes
# --------------------------------------------------------------------------


def naive(w: np.ndarray, vk: np.ndarray, causal: str | None) -> dict[str, np.ndarray]:
    """Straightforward float64 reference of the per-row arrays."""
    a = w.astype(np.float64)
    _, _, L, S = a.shape
    with np.errstate(divide="ignore", invalid="ignore"):
        h = -np.where(a > 0, a * np.log(a), 0.0).sum(-1)
    live = (a != 0).any(-1)
    pos = np.arange(L) + (S - L if causal == "bottom_right" else 0)
    dist = (a * np.abs(pos[:, None] - np.arange(S))).sum(-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        ne = np.where(live & (vk >= 2), h / np.log(np.maximum(vk, 2)), 0.0)
    return {
        "entropy": h,
        "normalized_entropy": ne,
        "max_weight": a.max(-1),
        "argmax": np.where(live, a.argmax(-1), -1),
        "effective_support": np.where(live, np.exp(h), 0.0),
        "zeros": (a == 0).sum(-1) - (S - vk),
        "attention_distance": dist,
    }


def masked_softmax(shape: tuple[int, ...], dtype: type, causal: str | None, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Random softmax weights with causal masking and some fully masked rows."""
    rng = np.random.default_rng(seed)
    B, H, L, S = shape
    z = rng.normal(0.0, 3.0, size=shape)
    keep = np.ones(shape, bool)
    if causal is not None:
        off = S - L if causal == "bottom_right" else 0
        keep &= np.arange(S)[None, :] <= np.arange(L)[:, None] + off
    keep[:, :, rng.integers(0, L)] = False
    z = np.where(keep, z, -np.inf)
    m = np.max(z, axis=-1, keepdims=True)
    e = np.exp(z - np.where(np.isfinite(m), m, 0.0))
    s = e.sum(-1, keepdims=True)
    w = np.divide(e, s, out=np.zeros_like(e), where=s > 0).astype(dtype)
    return w, keep.sum(-1)


@pytest.mark.parametrize("block", [1, 5, 64, 1 << 16])
@pytest.mark.parametrize("causal", [None, "top_left", "bottom_right"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16])
def test_matches_naive_reference_for_any_blocking(
    monkeypatch: pytest.MonkeyPatch, block: int, causal: str | None, dtype: type
) -> None:
    monkeypatch.setattr(rows, "BLOCK_ELEMENTS", block)
    shape = (2, 3, 5, 7) if causal != "bottom_right" else (2, 3, 4, 9)
    w, vk = masked_softmax(shape, dtype, causal, seed=block)
    r = attention_diagnostics(w, vk, causal=causal)
    ref = naive(w, vk, causal)
    rtol = 1e-12 if dtype == np.float64 else 2e-6
    for key in ROW_KEYS:
        np.testing.assert_allclose(r[key], ref[key], rtol=rtol, atol=1e-12, err_msg=key)
    assert r["fully_masked_rows"] == int((vk == 0).sum())
    assert_all_finite(r)


def test_valid_keys_broadcast_and_shape_errors() -> None:
    w = np.full((2, 3, 4, 5), 0.2)
    r = attention_diagnostics(w, np.array(5))
    assert r["normalized_entropy"] == pytest.approx(np.ones((2, 3, 4)))
    with pytest.raises(ValueError, match="4-D"):
        attention_diagnostics(w[0], np.array(5))
    with pytest.raises(ValueError, match="valid_keys"):
        attention_diagnostics(w, np.ones((2, 2, 4)))
    with pytest.raises(ValueError, match="scores"):
        attention_diagnostics(w, np.array(5), scores=np.zeros((2, 3, 4, 6)))


def test_empty_key_axis() -> None:
    r = attention_diagnostics(np.zeros((1, 2, 3, 0)), np.zeros((1, 2, 3), np.int64))
    assert r["fully_masked_rows"] == 6
    assert (r["argmax"] == -1).all()
    assert_all_finite(r)


def test_input_is_not_modified() -> None:
    w = np.full((1, 1, 2, 4), 0.25)
    w[0, 0, 0, 1] = np.nan
    before = w.copy()
    attention_diagnostics(w, np.array([[[4, 4]]]))
    np.testing.assert_array_equal(w, before)


# --------------------------------------------------------------------------
# probability_diagnostics
# --------------------------------------------------------------------------


def test_probability_diagnostics_last_axis() -> None:
    p = plain_softmax(REFERENCE_ROWS)
    r = probability_diagnostics(p)
    np.testing.assert_allclose(r["entropy"], REFERENCE_ENTROPIES, atol=5e-5)
    assert r["argmax"].tolist() == [2, 3, 2]
    np.testing.assert_allclose(r["max"], [0.6980, 0.6650, 0.6068], atol=5e-5)
    assert r["fully_masked_rows"] == 0 and r["non_finite"] == 0
    assert r["row_sum_max_error"] < 1e-15


def test_probability_diagnostics_axis_0() -> None:
    p = plain_softmax(REFERENCE_ROWS).T  # (4, 3): the distributions run down axis 0
    r = probability_diagnostics(p, axis=0)
    assert r["entropy"].shape == (3,)
    np.testing.assert_allclose(r["entropy"], REFERENCE_ENTROPIES, atol=5e-5)
    assert r["argmax"].tolist() == [2, 3, 2]


def test_probability_diagnostics_middle_axis_keeps_row_order() -> None:
    p = plain_softmax(REFERENCE_ROWS)  # (3, 4)
    stacked = np.stack([p, p[::-1]])  # (2, 3, 4)
    moved = np.moveaxis(stacked, -1, 1)  # (2, 4, 3): distributions along axis 1
    r = probability_diagnostics(moved.astype(np.float32), axis=1)
    assert r["entropy"].shape == (2, 3)
    np.testing.assert_allclose(r["entropy"][0], REFERENCE_ENTROPIES, atol=5e-5)
    np.testing.assert_allclose(r["entropy"][1], REFERENCE_ENTROPIES[::-1], atol=5e-5)
    assert r["argmax"].tolist() == [[2, 3, 2], [2, 3, 2]]
    np.testing.assert_array_equal(probability_diagnostics(moved, axis=-2)["argmax"], r["argmax"])


def test_probability_diagnostics_masked_rows_and_errors() -> None:
    p = np.array([[0.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    r = probability_diagnostics(p)
    assert r["argmax"].tolist() == [-1, 1]
    assert r["entropy"].tolist() == [0.0, 0.0]
    assert r["fully_masked_rows"] == 1
    with pytest.raises(ValueError, match="axis"):
        probability_diagnostics(p, axis=2)
    with pytest.raises(ValueError, match="axis"):
        probability_diagnostics(np.float64(1.0))
