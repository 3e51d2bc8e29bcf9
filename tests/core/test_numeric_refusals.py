"""Issue 21, items 4 and 5 (core): refusals that name the right thing and carry the remedy as data.

* /v1/attention/analyze read a score that overflowed float64 as masked (saturated_fraction 0.5, rows 0) and
  squared 1e300 scores into ``inf`` (score_std null); it now refuses such a sweep point as /v1/attention
  refuses the scores, and scales before squaring.
* A penalty that pushes every token out of range was blamed on a mask nobody sent; a float64 log-probability
  overflow advised float64; a float64 backward overflow said "retry with precision float64".
* Overflow errors carry ``remedies`` (and ``remedy``: "float64" where a wider dtype helps) for other protocols.
"""

from __future__ import annotations

import numpy as np
import pytest

from service.core import sampling as S
from service.core.analysis import analyze, sweep_points
from service.core.attention import attention
from service.core.backward import BackwardTask, run_backward
from service.core.errors import InvalidInput, NumericalError
from service.core.probabilities import normalize_logits
from service.core.types import AttentionInputs, AttentionParams, AttentionTask

# ------------------------------------------------------------------ 4. analyze at the ends of float64


@pytest.mark.parametrize(
    ("query", "key"),
    [
        ([[1e200, 0.0], [1.0, 0.0]], [[1e200, 0.0], [0.0, 1.0]]),  # one row's score overflows to +inf
        ([[1e160, 0.0]], [[1e160, 0.0], [-1e160, 1.0]]),  # +inf and -inf: the row looked fully masked
    ],
)
def test_analyze_refuses_scores_that_overflow_and_names_the_sweep_point(query, key) -> None:
    points = sweep_points([2], [0.5, 1.0], [1.0])
    with pytest.raises(NumericalError, match=r"at the sweep point scale = 0\.5, temperature = 1, head_dim = 2: "):
        analyze(np.array(query), np.array(key), points=points)
    with pytest.raises(NumericalError, match="the scores overflow float64") as err:
        analyze(np.array(query), np.array(key), points=points)
    assert err.value.remedies == ("smaller_inputs",) and err.value.remedy is None


@pytest.mark.parametrize("scale", [1e300, 1e-300])
def test_analyze_score_statistics_at_huge_and_tiny_scales(scale: float) -> None:
    """A representable std is reported (1.37e300 was null), and a tiny one is not 0."""
    q, k = np.array([[1.0, 2.0], [3.0, -1.0]]), np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    (unit,) = analyze(q, k, points=sweep_points([2], [1.0], [1.0]))
    (row,) = analyze(q, k, points=sweep_points([2], [scale], [1.0]))
    assert row.score_std == pytest.approx(unit.score_std * scale, rel=1e-12, abs=0)
    assert row.score_range == pytest.approx(unit.score_range * scale, rel=1e-12, abs=0)


def test_analyze_keeps_its_numbers_at_ordinary_scales() -> None:
    rng = np.random.default_rng(0)
    q, k = rng.standard_normal((2, 3, 16, 8)), rng.standard_normal((2, 3, 16, 8))
    (row,) = analyze(q, k, points=sweep_points([8], [0.35], [1.0]))
    z = 0.35 * q @ k.transpose(0, 1, 3, 2)
    assert row.score_std == pytest.approx(z.std(), rel=1e-13)
    assert row.score_range == pytest.approx(np.ptp(z, axis=-1).mean(), rel=1e-13)


# ------------------------------------------------------------------ 5. the messages name the right thing


@pytest.mark.parametrize(
    ("params", "previous", "dtype", "loc", "float64_helps"),
    [
        (S.SamplingParams(repetition_penalty=1e300), [0, 1], np.float32, ("repetition_penalty",), True),
        (S.SamplingParams(frequency_penalty=1e308), [0, 0, 1, 1], np.float64, ("frequency_penalty",), False),
    ],
)
def test_a_penalty_overflow_names_the_penalty_not_the_mask(params, previous, dtype, loc, float64_helps) -> None:
    with pytest.raises(InvalidInput) as err:
        S.process(np.array([-2.0, -3.0]), params, previous_tokens=previous, dtype=dtype)
    assert err.value.loc == loc
    message = str(err.value)
    assert "mask" not in message and loc[0] in message and "previous_tokens" in message
    assert ("precision float64" in message) == float64_helps
    assert err.value.remedy == ("float64" if float64_helps else None)
    assert "smaller_penalties" in err.value.remedies


def test_a_mask_that_removes_everything_is_still_the_mask() -> None:
    with pytest.raises(InvalidInput, match="the mask removes every token of row 0") as err:
        S.process(np.array([1.0, 2.0]), S.SamplingParams(), mask=np.array([False, False]), previous_tokens=[0])
    assert err.value.loc == ("mask",)


def test_a_float64_log_probability_overflow_does_not_advise_float64() -> None:
    with pytest.raises(InvalidInput) as err:
        normalize_logits(np.array([1.7e308, -1.7e308, 1.0]), with_log=True, dtype=np.float64)
    message = str(err.value)
    assert "precision float64" not in message and "leave out log" in message and "-inf" not in message
    assert err.value.remedy is None and err.value.remedies[0] == "omit_log"
    with pytest.raises(InvalidInput, match=r"use precision float64 \(or leave out log\)") as err32:
        normalize_logits(np.array([3e38, -3e38, 1.0]), with_log=True, dtype=np.float32)
    assert err32.value.remedy == "float64"


@pytest.mark.parametrize(("dtype", "remedy"), [(np.float32, "float64"), (np.float64, None)])
def test_overflow_errors_carry_the_remedy_as_data(dtype: type, remedy: str | None) -> None:
    big = 1e20 if dtype == np.float32 else 1e160
    q = np.full((1, 1, 2, 2), big)
    with pytest.raises(NumericalError) as err:
        attention(q, q, q, dtype=dtype, need_scores=True)
    assert err.value.remedy == remedy
    assert err.value.remedies == ((remedy,) if remedy else ()) + ("smaller_inputs",)
    assert ("precision float64" in str(err.value)) == (remedy is not None)
    with pytest.raises(NumericalError) as err:
        attention(q[..., :1, :], q, q, params=AttentionParams(temperature=1e-310), dtype=dtype)
    assert err.value.remedies == ((remedy,) if remedy else ()) + ("larger_temperature",)


def test_a_float64_backward_overflow_does_not_advise_float64() -> None:
    q = np.array([[[[1e154, 1e154]]]])
    v = np.array([[[[1e300, 1.0], [-1e300, 1.0]]]])
    task = AttentionTask(AttentionInputs(q, np.ones((1, 1, 2, 2)), v), AttentionParams(), np.dtype(np.float64))
    with pytest.raises(NumericalError) as err:
        run_backward(BackwardTask(task, np.full((1, 1, 1, 2), 1e300)))
    assert "precision float64" not in str(err.value) and "smaller inputs" in str(err.value)
    assert err.value.remedy is None and err.value.remedies == ("smaller_inputs",)
