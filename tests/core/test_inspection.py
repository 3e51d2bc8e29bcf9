"""The per-head inspection (service.core.diagnostics.inspection) against independent computations: the spectral
norm against numpy's SVD of the whole logits matrix, the pattern scores against TransformerLens' own numbers
(tests/golden/inspection.json), the sink mass and the norm-based weights against their definitions.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from service.core.diagnostics.inspection import (
    detection_patterns,
    norm_summary,
    norm_weights,
    pattern_scores,
    sink_mass,
    spectral_norms,
)

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "inspection.json"


@pytest.mark.parametrize(
    ("B", "Hq", "Hkv", "L", "S", "E"),
    [(1, 1, 1, 5, 7, 4), (2, 4, 2, 3, 9, 16), (1, 2, 1, 40, 30, 8), (2, 2, 2, 1, 1, 3), (1, 3, 3, 6, 2, 12)],
)  # small heads: the exact routes, to rounding
def test_spectral_norm_is_the_largest_singular_value_of_the_logits(B, Hq, Hkv, L, S, E) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(L * S + E)
    q = rng.standard_normal((B, Hq, L, E))
    k = rng.standard_normal((B, Hkv, S, E)) * 3.0
    lengths = rng.integers(0, S + 1, size=B)
    factor = 0.37
    got = spectral_norms(q, k, factor, lengths)
    for b in range(B):
        for h in range(Hq):
            n = int(lengths[b])
            logits = q[b, h] @ k[b, h // (Hq // Hkv), :n].T * factor
            want = np.linalg.norm(logits, 2) if n else 0.0
            assert got[b, h] == pytest.approx(want, rel=1e-12, abs=1e-12)


def test_sink_mass_leaves_fully_masked_rows_out() -> None:
    weights = np.array([[[[0.5, 0.25, 0.25], [0.0, 0.0, 0.0], [0.1, 0.1, 0.8]]]])
    valid = np.array([[[3, 0, 3]]])
    np.testing.assert_allclose(sink_mass(weights, valid, 1), [[(0.5 + 0.1) / 2]])
    np.testing.assert_allclose(sink_mass(weights, valid, 2), [[(0.75 + 0.2) / 2]])
    np.testing.assert_allclose(sink_mass(weights, valid, 0), [[0.0]])
    np.testing.assert_allclose(sink_mass(weights, np.zeros_like(valid), 2), [[0.0]])  # no live row: 0, not NaN


def test_the_detection_patterns_on_a_small_sequence() -> None:
    patterns = detection_patterns(np.array([7, 8, 7, 8]))
    np.testing.assert_array_equal(patterns["previous_token_score"], np.eye(4, k=-1))
    np.testing.assert_array_equal(
        patterns["duplicate_token_score"], [[0, 0, 0, 0], [0, 0, 0, 0], [1, 0, 0, 0], [0, 1, 0, 0]]
    )
    # the token after an earlier occurrence of the current token: position 2 (a 7) looks at 1, 3 (an 8) at 2
    np.testing.assert_array_equal(patterns["induction_score"], [[0, 0, 0, 0], [0, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0]])


def golden_cases() -> list[dict]:
    return json.loads(GOLDEN.read_text())["cases"]


@pytest.mark.parametrize("case", golden_cases(), ids=lambda c: f"S{len(c['tokens'])}")
def test_pattern_scores_match_transformer_lens(case: dict) -> None:
    weights = np.array(case["weights"])[None, None]
    scores = pattern_scores(
        weights,
        np.array([case["tokens"]]),
        exclude_bos=case["exclude_bos"],
        exclude_current_token=case["exclude_current_token"],
    )
    names = {
        "previous_token_head": "previous_token_score",
        "duplicate_token_head": "duplicate_token_score",
        "induction_head": "induction_score",
    }
    for reference, ours in names.items():
        want = case["expected"][reference]
        if np.isnan(want):  # TransformerLens divides 0 by 0 where every weight is excluded; the service says 0
            assert scores[ours][0, 0] == 0.0
        else:
            assert scores[ours][0, 0] == pytest.approx(want, rel=1e-12, abs=1e-12)


def test_pattern_scores_do_not_touch_the_weights() -> None:
    weights = np.full((1, 1, 3, 3), 1 / 3)
    before = weights.copy()
    pattern_scores(weights, np.array([[1, 1, 1]]), exclude_bos=True, exclude_current_token=True)
    np.testing.assert_array_equal(weights, before)


def test_norm_weights_and_their_summary() -> None:
    weights = np.array([[[[0.6, 0.4], [0.0, 0.0]], [[0.5, 0.5], [1.0, 0.0]]]])  # (1, 2, 2, 2): two query heads
    value = np.array([[[[3.0, 4.0], [0.0, 10.0]]]])  # one key head: norms 5 and 10
    normed = norm_weights(weights, value)
    np.testing.assert_allclose(normed[0, 0], [[3.0, 4.0], [0.0, 0.0]])
    np.testing.assert_allclose(normed[0, 1], [[2.5, 5.0], [5.0, 0.0]])
    share, agreement, rows = norm_summary(weights, normed)
    np.testing.assert_array_equal(rows, [[1, 2]])
    np.testing.assert_allclose(share, [[4 / 7, (5 / 7.5 + 1.0) / 2]])
    # head 0: argmax by weight is key 0, by norm key 1; head 1: row 0 ties at key 0 by weight (first index),
    # key 1 by norm; row 1 agrees
    np.testing.assert_allclose(agreement, [[0.0, 0.5]])


@pytest.mark.parametrize(("Hq", "Hkv"), [(8, 8), (4, 2), (6, 1)])
def test_norm_weights_are_the_norm_of_each_weighted_value(Hq: int, Hkv: int) -> None:
    """``||A_ij v_j||`` formed literally (each weighted value vector, then its norm), query head ``h`` reading key
    head ``h // (Hq / Hkv)``, against the product of the weights and the value norms.
    """
    rng = np.random.default_rng(Hq * 10 + Hkv)
    weights = rng.random((2, Hq, 5, 7)).astype(np.float32)
    value = rng.standard_normal((2, Hkv, 7, 3)).astype(np.float32)
    shared = np.repeat(value, Hq // Hkv, axis=1)  # (2, Hq, 7, 3)
    literal = np.linalg.norm(weights[..., None] * shared[:, :, None, :, :], axis=-1)
    normed = norm_weights(weights, value)
    assert normed.dtype == np.float32 and normed.shape == weights.shape
    np.testing.assert_allclose(normed, literal, rtol=1e-6)


def test_spectral_norm_of_float32_requests_within_the_stated_tolerance() -> None:
    # the power iteration's route (tests/core/test_spectral.py has the rest): 1e-6 for float32 requests
    rng = np.random.default_rng(5)
    q = rng.standard_normal((1, 8, 128, 64)).astype(np.float32)
    k = rng.standard_normal((1, 4, 100, 64)).astype(np.float32)
    got = spectral_norms(q, k, 0.125)
    for h in range(8):
        logits = q[0, h].astype(np.float64) @ k[0, h // 2].astype(np.float64).T * 0.125
        assert got[0, h] == pytest.approx(np.linalg.norm(logits, 2), rel=1e-6)
