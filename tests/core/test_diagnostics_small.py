"""service.core.diagnostics: the list path of small inputs gives what the numpy path gives.

Counts, argmax, zeros, max weights and flags agree exactly; every float agrees to 1e-12 relative
(entropy, distance and row sums are summed in another order, so they may differ in the last ulps;
``ln`` and ``exp`` are numpy's on both paths, float32 ``ln`` for float32 weights).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.core.diagnostics import DiagnosticThresholds, attention_diagnostics, report
from service.core.diagnostics.small import small_diagnostics

RTOL = 1e-12
ATOL = 1e-13  # sums of S <= 16 terms of magnitude <= ~1 that may cancel (weights above 1)
EXACT_ROWS = ("argmax", "zeros", "max_weight")
CLOSE_ROWS = ("entropy", "normalized_entropy", "effective_support", "attention_distance")


@contextmanager
def path(name: str) -> Iterator[None]:
    """Force the list path (``"list"``) or the numpy path (``"numpy"``) whatever the size."""
    saved = report._SMALL_WORK
    report._SMALL_WORK = 1 << 40 if name == "list" else 0
    try:
        yield
    finally:
        report._SMALL_WORK = saved


def both(w: np.ndarray, valid: Any, **kwargs: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    with path("list"):
        small = attention_diagnostics(w, valid, **kwargs)
    with path("numpy"):
        big = attention_diagnostics(w, valid, **kwargs)
    return small, big


def close(a: float, b: float, scale: float = 1.0) -> bool:
    return abs(a - b) <= RTOL * max(abs(a), abs(b)) + ATOL * scale


DEFAULT_THRESHOLDS = DiagnosticThresholds()


def assert_same(
    small: dict[str, Any], big: dict[str, Any], thresholds: DiagnosticThresholds = DEFAULT_THRESHOLDS
) -> None:
    """The two paths' results: same keys, types, shapes and dtypes; values as the module docstring says.

    A head's ``uniform`` flag compares a mean of float sums with a threshold: where that mean is within
    rounding of the threshold (a head of one uniform and one one-hot row has mean 0.5 up to an ulp),
    the two summation orders may fall on either side, and the flag is not compared.
    """
    assert small.keys() == big.keys()
    for key in EXACT_ROWS + CLOSE_ROWS:
        a, b = small[key], big[key]
        assert type(a) is np.ndarray and type(b) is np.ndarray, key
        assert a.dtype == b.dtype and a.shape == b.shape, key
        if key in EXACT_ROWS:
            np.testing.assert_array_equal(a, b, err_msg=key)
        else:
            np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL, err_msg=key)
    for key in ("fully_masked_rows", "non_finite", "saturated_rows"):
        assert type(small[key]) is int and small[key] == big[key], key
    assert type(small["row_sum_max_error"]) is float
    assert close(small["row_sum_max_error"], big["row_sum_max_error"])
    assert len(small["heads"]) == len(big["heads"])
    for hs, hb in zip(small["heads"], big["heads"], strict=True):
        assert hs.keys() == hb.keys()
        for k in hs:
            assert type(hs[k]) is type(hb[k]), k
            if isinstance(hs[k], float):
                assert close(hs[k], hb[k]), (k, hs[k], hb[k])
            elif k == "uniform" and close(hb["mean_normalized_entropy"], thresholds.uniform_normalized_entropy):
                continue  # on the threshold up to rounding: either answer is right
            else:
                assert hs[k] == hb[k], k
    ss, sb = small["score_stats"], big["score_stats"]
    assert (ss is None) == (sb is None)
    if ss is not None:
        assert ss.keys() == sb.keys()
        assert type(ss["count"]) is int and ss["count"] == sb["count"]
        assert ss["min"] == sb["min"] and ss["max"] == sb["max"]
        spread = max(abs(ss["min"]), abs(ss["max"]))
        for k in ("mean", "std"):
            assert type(ss[k]) is float
            assert close(ss[k], sb[k], spread), (k, ss[k], sb[k])


def make_case(
    seed: int, shape: tuple[int, int, int, int], dtype: type, non_finite: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Weights mixing every kind of row, valid keys (some < S), scores with -inf and an output with NaN."""
    rng = np.random.default_rng(seed)
    B, H, L, S = shape
    w = np.zeros(shape)
    valid = rng.integers(0, S + 1, size=shape[:3])
    for idx in np.ndindex(*shape[:3]):
        kind = rng.integers(0, 7)
        n = int(valid[idx])
        if kind == 0 and n:  # softmax over the first n keys, masked keys exactly 0
            z = rng.normal(0.0, rng.choice([0.1, 2.0, 30.0]), n)
            e = np.exp(z - z.max())
            w[idx][:n] = e / e.sum()
        elif kind == 1:  # relu-like: sums anywhere, some exact zeros, maybe all of them
            w[idx] = np.maximum(rng.normal(0.0, 1.0, S), 0.0) * rng.choice([0.0, 0.3, 1.0])
        elif kind == 2 and n:  # one-hot or uniform
            if rng.random() < 0.5:
                w[idx][rng.integers(0, n)] = 1.0
            else:
                w[idx][:n] = 1.0 / n
        elif kind == 3:  # strictly positive (no zero anywhere in rows like these), some subnormal
            w[idx] = rng.random(S) + 1e-3
            w[idx][rng.integers(0, S)] = np.finfo(dtype).tiny / 4
        elif kind == 4:  # nearly one-hot: saturated or just not
            w[idx] = rng.random(S) * rng.choice([1e-7, 1e-3])
            w[idx][rng.integers(0, S)] = 1.0
        # else: fully masked (all zero)
    w = w.astype(dtype)
    scores = np.where(w > 0, np.log(np.where(w > 0, w, 1.0)), -np.inf).astype(dtype)
    output = rng.standard_normal((B, H, L, 3)).astype(dtype)
    if non_finite:
        for _ in range(rng.integers(1, 4)):
            pos = tuple(int(rng.integers(0, d)) for d in shape)
            w[pos] = rng.choice([np.nan, np.inf, -np.inf])
            scores[tuple(int(rng.integers(0, d)) for d in shape)] = rng.choice([np.nan, np.inf])
        output[0, 0, 0, 0] = np.nan
    return w, valid, scores, output


@settings(max_examples=250, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    shape=st.tuples(st.integers(1, 2), st.integers(1, 3), st.integers(1, 8), st.integers(1, 16)),
    dtype=st.sampled_from([np.float32, np.float64]),
    causal=st.sampled_from([None, "top_left", "bottom_right"]),
    non_finite=st.booleans(),
    with_scores=st.booleans(),
    with_output=st.booleans(),
    collapsed_max_weight=st.sampled_from([0.9, 0.5, 1.0]),
    uniform=st.sampled_from([0.95, 0.5]),
)
def test_list_path_equals_numpy_path(
    seed: int,
    shape: tuple[int, int, int, int],
    dtype: type,
    causal: str | None,
    non_finite: bool,
    with_scores: bool,
    with_output: bool,
    collapsed_max_weight: float,
    uniform: float,
) -> None:
    w, valid, scores, output = make_case(seed, shape, dtype, non_finite)
    thresholds = DiagnosticThresholds(
        collapsed_max_weight=collapsed_max_weight, collapsed_row_fraction=0.25, uniform_normalized_entropy=uniform
    )
    small, big = both(
        w,
        valid,
        scores=scores if with_scores else None,
        output=output if with_output else None,
        causal=causal,
        thresholds=thresholds,
    )
    assert_same(small, big, thresholds)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_every_special_row_on_both_paths(dtype: type) -> None:
    """One of each: masked, relu zero-sum, NaN, +inf, -inf, one-hot, valid_keys 1 and 0, above 1."""
    rows = [
        [0.0, 0.0, 0.0, 0.0],
        [0.5, 0.5, 0.0, 0.0],
        [np.nan, 0.5, 0.5, 0.0],
        [np.inf, 0.0, 0.0, 0.0],
        [-np.inf, 0.25, 0.75, 0.0],
        [0.0, 1.0, 0.0, 0.0],
        [1.0, 0.0, 0.0, 0.0],
        [2.0, 1.5, 0.0, 0.7],
    ]
    w = np.array(rows, dtype)[None, None]
    valid = np.array([[[0, 2, 3, 4, 3, 2, 1, 4]]])
    scores = np.where(np.isfinite(w) & (w > 0), w, -np.inf)
    output = np.array([np.nan, 1.0, np.inf])
    for causal in (None, "top_left", "bottom_right"):
        small, big = both(w, valid, scores=scores, output=output, causal=causal)
        assert_same(small, big)
        assert small["non_finite"] == 5 and small["fully_masked_rows"] == 2
        assert small["argmax"].tolist() == [[[-1, 0, 1, -1, 2, 1, 0, 0]]]


def test_thresholds_switch_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    """The list path runs up to ``weights + 16 * rows == _SMALL_WORK`` and not one weight beyond."""
    calls: list[tuple[int, ...]] = []
    small_path = small_diagnostics

    def spy(w: np.ndarray, *args: Any) -> dict[str, Any] | None:
        calls.append(w.shape)
        return small_path(w, *args)

    monkeypatch.setattr(report, "small_diagnostics", spy)
    assert report._SMALL_WORK == 384 and report._ROW_WORK == 16
    at = (1, 1, 8, 32)  # 256 weights + 16 * 8 rows = 384
    above = (1, 1, 8, 33)  # 264 + 128 = 392
    many_rows = (2, 2, 8, 4)  # 128 + 16 * 32 = 640
    for shape in (at, above, many_rows):
        w = np.full(shape, 1.0 / shape[-1], np.float32)
        small_result, numpy_result = both(w, shape[-1])
        assert_same(small_result, numpy_result)
        calls.clear()
        attention_diagnostics(w, shape[-1])
        assert calls == ([shape] if shape == at else [])
    calls.clear()
    attention_diagnostics(np.full((1, 1, 2, 2), 0.5, np.float16), 2)  # float16: numpy path only
    attention_diagnostics(np.zeros((1, 1, 2, 0)), 0)  # no keys
    assert calls == []


def test_list_path_declines_huge_weights() -> None:
    """Finite weights beyond 1e290 may overflow a sum: the numpy path, which clamps, answers."""
    w = np.array([[[[1e308, 1e308, 0.0], [0.5, 0.5, 0.0]]]])
    assert small_diagnostics(w, np.full((1, 1, 2), 3), None, None, 0, DiagnosticThresholds()) is None
    small, big = both(w, 3)
    assert_same(small, big)
    assert math.isfinite(small["entropy"][0, 0, 0]) and small["row_sum_max_error"] == np.finfo(np.float64).max


def test_score_stats_beyond_1e154_fall_back_to_the_scaled_sums() -> None:
    w = np.full((1, 1, 1, 4), 0.25)
    scores = np.array([1e300, -1e300, 1e300, 0.0]).reshape(1, 1, 1, 4)
    small, big = both(w, 4, scores=scores)
    assert small["score_stats"] == big["score_stats"]
    assert small["score_stats"]["mean"] == pytest.approx(0.25e300)


@pytest.mark.parametrize("scores_dtype", [np.int32, np.float16, np.bool_])
def test_score_stats_of_other_dtypes_as_the_numpy_path(scores_dtype: type) -> None:
    w = np.full((1, 1, 2, 3), 1 / 3)
    scores = np.arange(6).reshape(w.shape).astype(scores_dtype)
    small, big = both(w, 3, scores=scores)
    assert small["score_stats"] == big["score_stats"]
    if scores_dtype is not np.bool_:
        assert small["score_stats"]["count"] == 6


def test_float32_entropy_uses_float32_ln() -> None:
    """The list path takes float32 weights' ln in float32, as the numpy path does (float64's differs)."""
    w = np.array([[[[0.1, 0.2, 0.3, 0.4]]]], np.float32)
    small, big = both(w, 4)
    expected = -sum(float(a) * float(np.log(a)) for a in w.reshape(-1))  # float32 ln, float64 sum
    f64 = -sum(float(a) * math.log(float(a)) for a in w.reshape(-1))
    assert small["entropy"][0, 0, 0] == pytest.approx(expected, rel=1e-15)
    assert big["entropy"][0, 0, 0] == pytest.approx(expected, rel=1e-15)
    assert expected != f64
