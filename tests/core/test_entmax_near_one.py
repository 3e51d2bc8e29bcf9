"""alpha-entmax near alpha = 1 (issue 21, item 2): float64 weights within 1e-9 of a 60-digit reference for every
alpha - 1 >= 1e-12, converging to softmax; before the fix the error grew as 1/(alpha - 1) (1e-5 at 1e-12).
"""

from __future__ import annotations

import numpy as np
import pytest

from service.core import normalizers
from service.core.attention import attention
from service.core.backward import BackwardTask, run_backward
from service.core.types import AttentionInputs, AttentionParams, AttentionTask
from tests.core.entmax_reference import entmax_reference

ALPHA_MINUS_ONE = [1e-12, 3e-12, 1e-11, 1e-10, 1e-9, 1e-8, 1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 0.01, 0.02, 0.1, 0.5, 1.0, 2.5]
ROWS = [
    [1.0 / np.sqrt(2), 2.0 / np.sqrt(2), 3.0 / np.sqrt(2)],  # the issue's request: q = [1, 2], keys [1,0], [0,1], [1,1]
    [3.0, -1.0, 0.5, 10.0, -20.0, 9.5, -np.inf, 2.0],
    list(np.random.default_rng(21).standard_normal(40) * 3),
    [0.0, 0.0, 0.0, -np.inf],
    [-1e4, -1e4 + 1.0, 5.0],
]


@pytest.mark.parametrize("am1", ALPHA_MINUS_ONE)
def test_float64_weights_match_the_60_digit_reference(am1: float) -> None:
    alpha = 1.0 + am1
    for row in ROWS:
        want = np.array(entmax_reference(row, alpha))
        got = normalizers.normalize(np.array(row), "entmax", alpha=alpha)
        assert np.abs(got - want).max() <= 1e-9, (am1, row[:4])
        assert got.sum() == pytest.approx(1.0, abs=1e-12)


def test_weights_converge_to_softmax_as_alpha_goes_to_one() -> None:
    z = np.array(ROWS[2])
    soft = normalizers.softmax(z)
    for am1, tol in ((1e-12, 1e-10), (1e-9, 1e-7), (1e-6, 1e-4)):
        np.testing.assert_allclose(normalizers.normalize(z, "entmax", alpha=1 + am1), soft, atol=tol, rtol=0)


def test_attention_answers_the_issues_request_in_float64() -> None:
    q = np.array([[1.0, 2.0]])
    k = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    v = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    r = attention(q, k, v, params=AttentionParams(normalizer="entmax", alpha=1.00000001), dtype=np.float64)
    want = np.array(entmax_reference((q @ k.T / np.sqrt(2))[0].tolist(), 1.00000001))
    np.testing.assert_allclose(r.weights[0], want, atol=1e-12, rtol=0)
    np.testing.assert_allclose(r.output[0], want @ v, atol=1e-12, rtol=0)


@pytest.mark.parametrize("am1", [1e-9, 1e-4])
def test_backward_matches_finite_differences_near_one(am1: float) -> None:
    """The VJP (``w = p^(2 - alpha)``) stays the derivative of the forward pass near alpha = 1."""
    rng = np.random.default_rng(5)
    q, k, v = rng.standard_normal((1, 1, 3, 4)), rng.standard_normal((1, 1, 5, 4)), rng.standard_normal((1, 1, 5, 2))
    g = rng.standard_normal((1, 1, 3, 2))
    params = AttentionParams(normalizer="entmax", alpha=1 + am1, temperature=0.7)

    def loss(q_: np.ndarray) -> float:
        return float((attention(q_, k, v, params=params, dtype=np.float64).output * g).sum())

    grads = run_backward(BackwardTask(AttentionTask(AttentionInputs(q, k, v), params, np.dtype(np.float64)), g))
    eps = 1e-6
    numeric = np.zeros_like(q)
    for idx in np.ndindex(q.shape):
        up, down = q.copy(), q.copy()
        up[idx] += eps
        down[idx] -= eps
        numeric[idx] = (loss(up) - loss(down)) / (2 * eps)
    np.testing.assert_allclose(grads.grad_query, numeric, atol=1e-7)
