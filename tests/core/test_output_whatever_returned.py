"""Issue 28, item 2: the output does not depend on what ``return`` asks for.

Without the weights, softmax multiplied the unnormalized exponentials by V and divided afterwards, so
``e V`` (up to S times the answer) overflowed where the answer did not: ``value: [[3e38], [3e38]]`` was a
422 blaming the scores with ``return: ["output"]`` and ``[[3e38]]`` with the weights. An output that
really overflows is still a 422, naming the output.
"""

from __future__ import annotations

import numpy as np
import pytest

import service.core.attention as core
from service.core.attention import attention, forward
from service.core.errors import NumericalError
from service.core.types import AttentionInputs, AttentionParams, AttentionTask


def outputs(q, k, v, dtype: type, **params) -> tuple[np.ndarray, np.ndarray]:
    """(output with ``return: ["output"]``, output with the weights requested)."""
    args = (np.asarray(q, dtype=np.float64), np.asarray(k, dtype=np.float64), np.asarray(v, dtype=np.float64))
    p = AttentionParams(**params)
    alone = attention(*args, params=p, dtype=dtype, need_weights=False).output
    with_weights = attention(*args, params=p, dtype=dtype, need_weights=True).output
    return alone, with_weights


@pytest.mark.parametrize(("dtype", "big"), [(np.float32, 3e38), (np.float64, 1.7e308)])
def test_the_issues_request_gives_the_value_with_or_without_weights(dtype: type, big: float) -> None:
    alone, with_weights = outputs([[1.0, 0.0]], [[1.0, 0.0], [0.0, 1.0]], [[big], [big]], dtype)
    assert np.array_equal(alone, with_weights)
    np.testing.assert_allclose(alone, [[big]], rtol=1e-6)


def test_two_values_near_float32s_largest_mix_without_overflowing() -> None:
    alone, with_weights = outputs([[0.0]], [[0.0], [0.0]], [[3e38], [3.4e38]], np.float32)
    assert np.array_equal(alone, with_weights)
    np.testing.assert_allclose(alone, [[3.2e38]], rtol=1e-6)


@pytest.mark.parametrize("S", [4096, 512])
def test_near_uniform_rows_of_large_values(S: int) -> None:
    """|V| = 1e35 on near-uniform rows: ``e V`` reaches 4,096 * 1e35 > 3.4e38 (S = 4,096, the chunked path;
    S = 512 with values of 1e36, the one-pass path).
    """
    rng = np.random.default_rng(0)
    q = 0.01 * rng.standard_normal((1, 2, 8, 16))
    k = rng.standard_normal((1, 2, S, 16))
    big = 1e35 if S == 4096 else 1e36
    v = big * (1 + 0.1 * rng.random((1, 2, S, 4)))
    v[..., 1] *= -1
    assert (1 * 2 * 8 * S > forward.FAST_PATH_SCORES) == (S == 4096)
    alone, with_weights = outputs(q, k, v, np.float32)
    assert np.isfinite(alone).all()
    np.testing.assert_allclose(alone, with_weights, rtol=1e-6)
    np.testing.assert_allclose(np.abs(alone), 1.05 * big, rtol=0.01)


def test_large_values_give_the_same_numbers_on_both_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows computed again after an overflow are computed alone: the one-pass and chunked paths still agree."""
    rng = np.random.default_rng(1)
    v = rng.standard_normal((2, 3, 64, 4))
    v[0, 1] = 3e38 * (0.9 + 0.1 * rng.random((64, 4)))  # one head overflows ``e V``, the others do not
    task = AttentionTask(
        AttentionInputs(rng.standard_normal((2, 3, 16, 8)), rng.standard_normal((2, 3, 64, 8)), v),
        AttentionParams(),
        np.dtype(np.float32),
        need_weights=False,
    )
    monkeypatch.setattr(forward, "FAST_PATH_SCORES", 1 << 30)
    fast = core.run_attention(task).output
    monkeypatch.setattr(forward, "FAST_PATH_SCORES", -1)
    chunked = core.run_attention(task).output
    assert np.array_equal(fast, chunked)
    assert np.isfinite(fast).all()


# Scores whose float32 softmax weights round to a sum above 1 (by more than half an ulp of 1): times values
# at float32's largest, the weighted mean exceeds it on either order of operations.
OVER_ONE = [0.00020164294983260334, 0.32391196489334106, 0.9520218968391418, -0.3007558584213257, 1.4367365837097168]


@pytest.mark.parametrize("need_weights", [False, True])
def test_an_output_that_really_overflows_is_a_422_naming_the_output(need_weights: bool) -> None:
    top = float(np.finfo(np.float32).max)
    q, k, v = np.ones((1, 1)), np.array(OVER_ONE)[:, None], np.full((len(OVER_ONE), 1), top)
    with pytest.raises(NumericalError, match=r"^the attention output overflows float32") as err:
        attention(q, k, v, dtype=np.float32, need_weights=need_weights)
    assert "scores" not in str(err.value) and err.value.remedy == "float64"
    out = attention(q, k, v, dtype=np.float64, need_weights=need_weights).output  # float64 holds it
    np.testing.assert_allclose(out, [[top]], rtol=1e-6)


@pytest.mark.parametrize("normalizer", ["softmax", "sparsemax", "entmax15", "entmax", "relu"])
@pytest.mark.parametrize("need_weights", [False, True])
def test_scores_that_overflow_to_plus_inf_are_still_blamed_on_the_scores(normalizer: str, need_weights: bool) -> None:
    q, k, v = np.array([[1e200, 0.0], [1.0, 0.0]]), np.array([[1e200, 0.0], [0.0, 1.0]]), np.array([[1.0], [2.0]])
    params = AttentionParams(normalizer=normalizer, alpha=1.5 if normalizer == "entmax" else None)
    with pytest.raises(NumericalError, match="the scores overflow float64"):
        attention(q, k, v, params=params, dtype=np.float64, need_weights=need_weights)
