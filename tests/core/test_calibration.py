"""service.core.calibration: the golden cases, optimality of the fit, ECE by hand, and bad inputs."""

from __future__ import annotations

import numpy as np
import pytest

from service.core import calibration as C
from service.core.errors import InvalidInput
from tests import golden

CASES = golden.load("calibrate")


@pytest.mark.parametrize("case", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_golden(case) -> None:
    req = case["request"]
    got = C.calibrate(np.array(req["logits"]), np.array(req["labels"]), req["bins"])
    assert got.fit.temperature == pytest.approx(case["temperature"], rel=1e-6)
    assert not got.fit.bounded
    assert got.nll_before == pytest.approx(case["nll"]["before"], abs=1e-12)
    assert got.nll_after == pytest.approx(case["nll"]["after"], abs=1e-10)
    assert got.before.ece == pytest.approx(case["ece"]["before"], abs=1e-12)
    assert got.after.ece == pytest.approx(case["ece"]["after"], abs=1e-7)
    assert got.before.accuracy == got.after.accuracy == pytest.approx(case["accuracy"], abs=1e-15)
    assert got.before.count.sum() == got.after.count.sum() == len(req["labels"])


@pytest.mark.parametrize("case", CASES[:3], ids=[f"case{i}" for i in range(3)])
def test_the_fit_is_a_minimum_to_one_part_in_a_million(case) -> None:
    z, y = np.array(case["request"]["logits"]), np.array(case["request"]["labels"])
    t = C.fit_temperature(z, y).temperature
    best = C.mean_nll(z, y, t)
    for factor in (1 - 1e-4, 1 + 1e-4, 0.5, 2.0):
        assert C.mean_nll(z, y, t * factor) > best
    _, g, _ = C._softmax_stats(z, z[np.arange(len(y)), y], 1 / t)  # the derivative in 1/T vanishes
    assert abs(g) < 1e-9


def test_optimum_at_the_ends_is_bounded() -> None:
    rng = np.random.default_rng(0)
    z = rng.standard_normal((200, 4))
    sharp = C.fit_temperature(z, np.argmax(z, axis=1))  # always right: the colder the better
    assert sharp.temperature == C.T_MIN and sharp.bounded
    noise = C.fit_temperature(z * 50, rng.integers(0, 4, 200))  # labels unrelated to huge logits
    assert noise.temperature == C.T_MAX and noise.bounded
    flat = C.fit_temperature(np.ones((10, 3)), np.zeros(10, dtype=int))  # every T fits equally well
    assert flat.temperature == 1.0 and not flat.bounded


def test_labels_independent_of_logits_push_t_to_the_upper_end() -> None:
    z = np.tile([[5.0, 0.0]], (100, 1))
    y = np.array([0, 1] * 50)  # half right: the best softmax is uniform, T -> infinity
    fit = C.fit_temperature(z, y)
    assert fit.temperature == C.T_MAX and fit.bounded


def test_large_logits_stay_finite() -> None:
    z = np.array([[1e100, 0.0, -1e100], [0.0, 1e100, 1.0], [1.0, 2.0, 0.0]])
    got = C.calibrate(z, np.array([0, 0, 2]))
    assert got.fit.temperature == C.T_MAX and got.fit.bounded
    assert np.isfinite([got.nll_before, got.nll_after, got.before.ece, got.after.ece]).all()


def test_ece_and_bins_by_hand() -> None:
    # Confidences 0.5 (two classes tied: prediction is class 0), 0.8808 and 0.9526 with 2 bins (0, .5], (.5, 1].
    z = np.array([[0.0, 0.0], [2.0, 0.0], [0.0, 3.0]])
    y = np.array([1, 0, 0])
    r = C.reliability(z, y, bins=2)
    conf = np.array([0.5, 1 / (1 + np.exp(-2)), 1 / (1 + np.exp(-3))])
    assert r.count.tolist() == [1, 2]
    np.testing.assert_allclose(r.confidence, [0.5, conf[1:].mean()])
    np.testing.assert_allclose(r.bin_accuracy, [0.0, 0.5])
    assert r.ece == pytest.approx((1 * 0.5 + 2 * abs(0.5 - conf[1:].mean())) / 3)
    assert r.accuracy == pytest.approx(1 / 3)
    bins = C.reliability(z, y, bins=4).bins()
    assert [b["count"] for b in bins] == [0, 1, 0, 2]
    assert bins[0]["confidence"] is None and bins[0]["accuracy"] is None
    assert bins[1]["lower"] == 0.25 and bins[1]["upper"] == 0.5


@pytest.mark.parametrize(
    ("logits", "labels", "loc"),
    [
        ([[1.0, 2.0], [3.0, 4.0]], [0, 2], ("labels", 1)),
        ([[1.0, 2.0], [3.0, 4.0]], [-1, 0], ("labels", 0)),
        ([[1.0, 2.0], [3.0, np.nan]], [0, 1], ("logits", 1, 1)),
        ([[1.0, 2.0], [np.inf, 0.0]], [0, 1], ("logits", 1, 0)),
        ([[1.0, 2.0]], [0, 1], ("labels",)),
        (np.zeros((0, 3)), [], ("logits",)),
        ([[1.0], [2.0]], [0, 0], ("logits", "shape", 1)),
        ([1.0, 2.0], [0], ("logits",)),
        ([[1.0, 2.0], [3.0, -1e200]], [0, 1], ("logits", 1, 1)),
    ],
)
def test_bad_inputs_name_the_place(logits, labels, loc) -> None:
    with pytest.raises(InvalidInput) as err:
        C.calibrate(np.array(logits, dtype=np.float64), np.array(labels, dtype=np.int64))
    assert err.value.loc == loc


def test_core_modules_import_no_web_framework() -> None:
    import subprocess
    import sys

    code = (
        "import sys, service.core.sampling, service.core.calibration;"
        "bad = [m for m in ('fastapi', 'pydantic', 'starlette') if m in sys.modules];"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
