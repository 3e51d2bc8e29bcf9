"""/v1/sample's temperature step at the ends of the float range (issue 21, item 3).

Logits that span more than the dtype, brought back by a large temperature: the sampler subtracted the row max
first (the difference overflowed to -inf) and capped T at the dtype's largest number, so it drew from the
wrong distribution where /v1/softmax answered right. Both now form the scaled values in float64 and round once.
"""

from __future__ import annotations

import numpy as np
import pytest

from service.core import normalizers
from service.core import sampling as S
from service.core.probabilities import normalize_logits

CASES = [
    # (logits, temperature, dtype, the exact distribution)
    ([-1e38, 3e38, 0.0], 1e38, np.float32, normalizers.softmax(np.array([-1.0, 3.0, 0.0]))),
    ([2e38, 1e38, 0.0], 1e39, np.float32, normalizers.softmax(np.array([0.2, 0.1, 0.0]))),
    ([-1.7e308, 1.7e308], 1.5e308, np.float64, normalizers.softmax(np.array([-1.7, 1.7]) / 1.5)),
]


def final(logits: list[float], temperature: float, dtype: type) -> np.ndarray:
    filtered, _ = S.process(np.array(logits, dtype=dtype), S.SamplingParams(temperature=temperature), dtype=dtype)
    return filtered.dense(np.float64)[0]


@pytest.mark.parametrize(("logits", "temperature", "dtype", "want"), CASES)
def test_large_temperatures_bring_huge_logits_back(logits, temperature, dtype, want) -> None:
    np.testing.assert_allclose(final(logits, temperature, dtype), want, rtol=1e-6, atol=0)


@pytest.mark.parametrize(("logits", "temperature", "dtype", "want"), CASES)
def test_sample_and_softmax_agree(logits, temperature, dtype, want) -> None:
    """One scaling rule: the sampler's distribution (no filters) is /v1/softmax's."""
    soft = normalize_logits(np.array(logits, dtype=dtype), temperature=temperature, dtype=dtype).probabilities
    np.testing.assert_allclose(final(logits, temperature, dtype), soft, rtol=1e-6, atol=0)


def test_temperatures_beyond_the_dtype_are_not_capped() -> None:
    """float32 logits at T = 1e39 and at T = 3.4e38 (float32's largest) are different distributions."""
    at_1e39 = final([2e38, 1e38, 0.0], 1e39, np.float32)
    at_max = final([2e38, 1e38, 0.0], float(np.finfo(np.float32).max), np.float32)
    assert not np.allclose(at_1e39, at_max, rtol=1e-3)


def test_the_draw_follows_the_right_distribution() -> None:
    """The tokens of many draws come from the exact distribution, not from [0, 0.9526, 0.0474]."""
    filtered, _ = S.process(np.array([-1e38, 3e38, 0.0], dtype=np.float32), S.SamplingParams(temperature=1e38))
    tokens, _ = S.draw(filtered, S.uniforms(1, (1, 20000)))
    counts = np.bincount(tokens[0], minlength=3) / 20000
    assert counts[0] > 0.01  # token 0 has probability 0.0171; it was never drawn
    np.testing.assert_allclose(counts, CASES[0][3], atol=0.01)


def test_small_temperatures_still_shift_first() -> None:
    """T < 1 divides the differences from the max (which cannot overflow past 0), as before."""
    np.testing.assert_array_equal(final([3e38, 2.9e38, -3e38], 1e-30, np.float32), [1, 0, 0])
    got = final([1e308, 1e308 - 1e300, -1e308], 1e300, np.float64)
    np.testing.assert_allclose(got, normalizers.softmax(np.array([1e8, 1e8 - 1.0, -1e8])), rtol=1e-12)
    np.testing.assert_allclose(
        final([1000.0, 1000.5, 999.0], 0.3, np.float32),
        normalizers.softmax(np.array([0.0, 0.5, -1.0]) / 0.3),
        rtol=1e-6,
    )
