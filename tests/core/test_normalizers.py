"""Tests of service.core.normalizers against docs/concepts/normalizers.md, docs/concepts/contract.md ("Gradients",
"Reference numbers") and the masking contract (-inf in, exact 0 out, no NaN).
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from service.core import types
from service.core.normalizers import (
    NORMALIZER_NAMES,
    entmax15,
    entmax_backward,
    entmax_bisect,
    log_softmax,
    normalize,
    normalize_backward,
    relu_backward,
    relu_normalize,
    softmax,
    softmax_backward,
    sparsemax,
    sparsemax_backward,
)

Forward = Callable[..., np.ndarray]

# docs/concepts/contract.md, "Reference numbers" (float64, rounded to 4 places).
ROWS = np.array(
    [
        [1.0, 0.5, 2.5, -0.1],
        [2.1, 0.5, -1.2, 3.0],
        [1.8, -0.3, 2.5, 0.1],
    ]
)
REF = {
    "softmax": [
        [0.1557, 0.0945, 0.6980, 0.0518],
        [0.2704, 0.0546, 0.0100, 0.6650],
        [0.3013, 0.0369, 0.6068, 0.0550],
    ],
    "sparsemax": [[0, 0, 1, 0], [0.05, 0, 0, 0.95], [0.15, 0, 0.85, 0]],
    "entmax15": [[0.0504, 0, 0.9496, 0], [0.1983, 0, 0, 0.8017], [0.2602, 0, 0.7398, 0]],
}
G_ROW2 = np.array([0.3, -1.0, 0.5, 2.0])
REF_BACKWARD_ROW2 = {
    "softmax": [-0.2870, -0.1289, -0.0086, 0.4246],
    "sparsemax": [-0.85, 0, 0, 0.85],
    "entmax15": [-0.5056, 0, 0, 0.5056],
}
ATOL_REF = 1e-4

# Every forward map under test, by a label. The bisection ones are the
# independent algorithm (never routed to the sort-based code).
FORWARDS: dict[str, Forward] = {
    "softmax": softmax,
    "sparsemax": sparsemax,
    "entmax15": entmax15,
    "bisect_1.25": lambda z, axis=-1: entmax_bisect(z, 1.25, axis),
    "bisect_1.5": lambda z, axis=-1: entmax_bisect(z, 1.5, axis),
    "bisect_2": lambda z, axis=-1: entmax_bisect(z, 2.0, axis),
    "bisect_3": lambda z, axis=-1: entmax_bisect(z, 3.0, axis),
    "relu": relu_normalize,
}
SHIFT_INVARIANT = [name for name in FORWARDS if name != "relu"]
# (label, alpha) of the entmax family: softmax is alpha -> 1, sparsemax alpha = 2.
ALPHAS = {"sparsemax": 2.0, "entmax15": 1.5, "bisect_1.25": 1.25, "bisect_1.5": 1.5, "bisect_2": 2.0, "bisect_3": 3.0}

# normalize() spelled for each public name (entmax with a non-routed alpha).
NAMED: dict[str, dict[str, float]] = {
    "softmax": {},
    "sparsemax": {},
    "entmax15": {},
    "entmax": {"alpha": 1.7},
    "relu": {},
}

RAISE_ON_INVALID = {"divide": "raise", "over": "raise", "invalid": "raise"}
FAST = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# --------------------------------------------------------------------------- strategies


@st.composite
def rows(
    draw: st.DrawFn, dtype: type = np.float64, masked: bool = True, lo: float = -50.0, hi: float = 50.0
) -> np.ndarray:
    """A 1-D row of length 1..20 in [lo, hi], optionally with some entries -inf."""
    width = 32 if dtype == np.float32 else 64
    n = draw(st.integers(1, 20))
    z = draw(hnp.arrays(dtype, n, elements=st.floats(lo, hi, width=width)))
    if masked:
        mask = draw(hnp.arrays(np.bool_, n))
        z[mask] = -np.inf
    return z


def with_a_finite(z: np.ndarray) -> bool:
    return bool(np.isfinite(z).any())


# --------------------------------------------------------------------------- reference numbers


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("name", list(REF))
def test_reference_table(name: str, dtype: type) -> None:
    expected = np.array(REF[name])
    got = normalize(ROWS.astype(dtype), name)
    assert got.dtype == dtype
    np.testing.assert_allclose(got, expected, atol=ATOL_REF, rtol=0)
    direct = {"softmax": softmax, "sparsemax": sparsemax, "entmax15": entmax15}[name]
    np.testing.assert_allclose(direct(ROWS.astype(dtype)), expected, atol=ATOL_REF, rtol=0)


@pytest.mark.parametrize("alpha, name", [(2.0, "sparsemax"), (1.5, "entmax15")])
def test_reference_table_by_bisection(alpha: float, name: str) -> None:
    np.testing.assert_allclose(entmax_bisect(ROWS, alpha), REF[name], atol=ATOL_REF, rtol=0)
    np.testing.assert_allclose(normalize(ROWS, "entmax", alpha=alpha), REF[name], atol=ATOL_REF, rtol=0)


def test_sparse_reference_zeros_are_exact() -> None:
    for name in ("sparsemax", "entmax15"):
        got = normalize(ROWS, name)
        assert np.array_equal(got == 0, np.array(REF[name]) == 0)


def test_log_softmax_row2() -> None:
    np.testing.assert_allclose(log_softmax(ROWS[1]), [-1.3079, -2.9079, -4.6079, -0.4079], atol=ATOL_REF, rtol=0)
    np.testing.assert_allclose(np.exp(log_softmax(ROWS)), softmax(ROWS), rtol=1e-12)


def test_softmax_temperature_2() -> None:
    got = softmax(ROWS[1:] / 2.0)
    np.testing.assert_allclose(
        got, [[0.3116, 0.1400, 0.0598, 0.4886], [0.3128, 0.1095, 0.4440, 0.1337]], atol=ATOL_REF, rtol=0
    )


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_relu_rows_2_3(dtype: type) -> None:
    got = normalize(ROWS[1:].astype(dtype), "relu")
    assert got.dtype == dtype
    np.testing.assert_allclose(got, [[0.375, 0.0893, 0, 0.5357], [0.4091, 0, 0.5682, 0.0227]], atol=ATOL_REF, rtol=0)
    assert got[0, 2] == 0 and got[1, 1] == 0


@pytest.mark.parametrize("name", list(REF_BACKWARD_ROW2))
def test_backward_reference_row2(name: str) -> None:
    p = normalize(ROWS[1], name)
    expected = REF_BACKWARD_ROW2[name]
    np.testing.assert_allclose(normalize_backward(name, p, G_ROW2), expected, atol=ATOL_REF, rtol=0)
    direct = {
        "softmax": lambda: softmax_backward(p, G_ROW2),
        "sparsemax": lambda: sparsemax_backward(p, G_ROW2),
        "entmax15": lambda: entmax_backward(p, G_ROW2, 1.5),
    }[name]()
    np.testing.assert_allclose(direct, expected, atol=ATOL_REF, rtol=0)


def test_backward_reference_row2_via_entmax_alpha() -> None:
    p2 = sparsemax(ROWS[1])
    np.testing.assert_allclose(
        normalize_backward("entmax", p2, G_ROW2, alpha=2.0), REF_BACKWARD_ROW2["sparsemax"], atol=ATOL_REF, rtol=0
    )
    p15 = entmax15(ROWS[1])
    np.testing.assert_allclose(
        normalize_backward("entmax", p15, G_ROW2, alpha=1.5), REF_BACKWARD_ROW2["entmax15"], atol=ATOL_REF, rtol=0
    )


# --------------------------------------------------------------------------- API and dispatch


def test_names_match_shared_types() -> None:
    assert NORMALIZER_NAMES == ("softmax", "sparsemax", "entmax15", "entmax", "relu")
    assert NORMALIZER_NAMES == types.NORMALIZERS


def test_entmax_routing() -> None:
    z = np.random.default_rng(1).normal(size=(5, 9)) * 3
    assert np.array_equal(normalize(z, "entmax", alpha=2.0), sparsemax(z))
    assert np.array_equal(normalize(z, "entmax", alpha=1.5), entmax15(z))
    assert np.array_equal(normalize(z, "entmax", alpha=1.7), entmax_bisect(z, 1.7))
    # alpha is ignored by the other normalizers
    assert np.array_equal(normalize(z, "softmax", alpha=3.0), softmax(z))


@pytest.mark.parametrize("alpha", [None, 1.0, 0.5, -2.0, float("nan"), float("inf")])
def test_entmax_rejects_alpha(alpha: float | None) -> None:
    z = np.zeros(3)
    with pytest.raises(ValueError):
        normalize(z, "entmax", alpha=alpha)
    with pytest.raises(ValueError):
        normalize_backward("entmax", z, z, alpha=alpha)
    if alpha is not None:
        with pytest.raises(ValueError):
            entmax_bisect(z, alpha)


def test_unknown_name_and_missing_z() -> None:
    with pytest.raises(ValueError, match="unknown normalizer"):
        normalize(np.zeros(3), "softermax")
    with pytest.raises(ValueError, match="unknown normalizer"):
        normalize_backward("softermax", np.zeros(3), np.zeros(3))
    with pytest.raises(ValueError, match="needs the scores z"):
        normalize_backward("relu", np.zeros(3), np.zeros(3))


@pytest.mark.parametrize("name", NORMALIZER_NAMES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_dtype_preserved(name: str, dtype: type) -> None:
    z = ROWS.astype(dtype)
    assert normalize(z, name, **NAMED[name]).dtype == dtype
    assert normalize(z.astype(np.int64), name, **NAMED[name]).dtype == np.float64


@pytest.mark.parametrize("label", list(FORWARDS))
@pytest.mark.parametrize("axis", [0, 1, 2, -2])
def test_any_rank_any_axis(label: str, axis: int) -> None:
    rng = np.random.default_rng(7)
    z = rng.normal(size=(3, 5, 6)) * 2
    z[rng.random(z.shape) < 0.2] = -np.inf
    f = FORWARDS[label]
    got = f(z, axis=axis)
    assert got.shape == z.shape
    moved = np.moveaxis(z, axis, -1).reshape(-1, z.shape[axis])
    expected = np.stack([f(r) for r in moved]).reshape(np.moveaxis(z, axis, -1).shape)
    np.testing.assert_allclose(np.moveaxis(got, axis, -1), expected, atol=1e-12)


@pytest.mark.parametrize("name", NORMALIZER_NAMES)
@pytest.mark.parametrize("shape", [(0, 4), (3, 0), (0,)])
def test_empty_arrays(name: str, shape: tuple[int, ...]) -> None:
    got = normalize(np.zeros(shape, np.float32), name, **NAMED[name])
    assert got.shape == shape and got.dtype == np.float32


def test_bisect_explicit_iterations() -> None:
    z = np.random.default_rng(3).normal(size=(4, 10))
    np.testing.assert_allclose(entmax_bisect(z, 1.3, n_iter=120), entmax_bisect(z, 1.3), atol=1e-14)
    coarse = entmax_bisect(z, 1.3, n_iter=8)  # still renormalised
    np.testing.assert_allclose(coarse.sum(-1), 1.0, atol=1e-12)


# --------------------------------------------------------------------------- masking contract


@pytest.mark.parametrize("label", list(FORWARDS))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fully_masked_rows_are_zero(label: str, dtype: type) -> None:
    z = np.array([[1.0, -2.0, 0.5], [-np.inf] * 3, [-np.inf, 4.0, -np.inf]], dtype=dtype)
    z3 = np.stack([z, np.full_like(z, -np.inf)])  # rank 3, a fully masked block
    with np.errstate(**RAISE_ON_INVALID):
        p = FORWARDS[label](z)
        p3 = FORWARDS[label](z3)
        p_axis0 = FORWARDS[label](z.T, axis=0)
    assert p.dtype == dtype
    assert np.array_equal(p[1], np.zeros(3, dtype))
    assert np.array_equal(p[2], np.array([0, 1, 0], dtype))
    assert np.all(np.isfinite(p3)) and np.array_equal(p3[1], np.zeros((3, 3), dtype))
    np.testing.assert_allclose(p_axis0, p.T, rtol=1e-6)
    np.testing.assert_allclose(p[0].sum(), 1.0, rtol=1e-6)


@pytest.mark.parametrize("name", NORMALIZER_NAMES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fully_masked_via_normalize_and_out(name: str, dtype: type) -> None:
    z = np.full((2, 5), -np.inf, dtype)
    z[1, 3] = 0.7
    with np.errstate(**RAISE_ON_INVALID):
        got = normalize(z.copy(), name, **NAMED[name])
        buf = z.copy()
        inplace = normalize(buf, name, out=buf, **NAMED[name])
    assert inplace is buf
    for p in (got, inplace):
        assert np.array_equal(p, np.array([[0] * 5, [0, 0, 0, 1, 0]], dtype))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_log_softmax_masked(dtype: type) -> None:
    z = np.array([[-np.inf] * 3, [0.0, -np.inf, 1.0]], dtype)
    with np.errstate(**RAISE_ON_INVALID):
        got = log_softmax(z)
    assert got.dtype == dtype
    assert np.all(got[0] == -np.inf) and got[1, 1] == -np.inf
    assert not np.isnan(got).any()
    np.testing.assert_allclose(got[1, [0, 2]], log_softmax(np.array([0.0, 1.0])), rtol=1e-6)


@pytest.mark.parametrize("label", [k for k in FORWARDS if k != "relu"])
def test_single_finite_entry_is_one_hot(label: str) -> None:
    for value in (-40.0, 0.0, 3.5):
        for j in range(4):
            z = np.full(4, -np.inf)
            z[j] = value
            assert np.array_equal(FORWARDS[label](z), np.eye(4)[j])
            assert np.array_equal(FORWARDS[label](z.astype(np.float32)), np.eye(4, dtype=np.float32)[j])


def test_relu_single_entry_and_nonpositive_rows() -> None:
    z = np.array([[-np.inf, 2.5, -np.inf], [-1.0, 0.0, -3.0], [-np.inf, -1.0, -np.inf]])
    with np.errstate(**RAISE_ON_INVALID):
        p = relu_normalize(z)
        dz = relu_backward(z, np.ones_like(z))
    assert np.array_equal(p, [[0, 1, 0], [0, 0, 0], [0, 0, 0]])
    assert np.array_equal(dz, np.zeros_like(z))


def test_backward_of_masked_rows_is_zero() -> None:
    p = np.zeros((2, 4))
    p[1, 2] = 1.0
    g = np.array([[1.0, 2.0, -1.0, 0.5], [np.inf, 3.0, 1.0, -np.inf]])  # junk on masked
    with np.errstate(**RAISE_ON_INVALID):
        outs = [
            softmax_backward(p, g),
            sparsemax_backward(p, g),
            entmax_backward(p, g, 1.5),
            entmax_backward(p, g, 3.0),
        ]
        for name in ("softmax", "sparsemax", "entmax15"):
            outs.append(normalize_backward(name, p, g))
        z = np.full((2, 4), -np.inf)
        outs.append(normalize_backward("relu", p, g, z=z))
    for dz in outs:
        assert np.array_equal(dz, np.zeros((2, 4))), dz


# --------------------------------------------------------------------------- large scores


@pytest.mark.parametrize("label", list(FORWARDS))
def test_float32_large_scores(label: str) -> None:
    f = FORWARDS[label]
    z = np.array([[1e4, -1e4, 3.0, -5.0], [1e4, 9999.5, -1e4, -np.inf]], np.float32)
    with np.errstate(**RAISE_ON_INVALID):
        p = f(z)
    assert p.dtype == np.float32 and np.all(np.isfinite(p))
    if label == "relu":
        np.testing.assert_allclose(p[0], [1e4 / 10003, 0, 3 / 10003, 0], rtol=1e-6)
        np.testing.assert_allclose(p[1], [1e4 / 19999.5, 9999.5 / 19999.5, 0, 0], rtol=1e-6)
        return
    assert np.array_equal(p[0], [1, 0, 0, 0])  # one-hot on the max, exactly
    # the 0.5 gap is resolved exactly as the same row shifted near 0 in float64
    np.testing.assert_allclose(p[1], f(np.array([0.0, -0.5, -2e4, -np.inf])), atol=1e-6)


def test_float32_large_scores_named_values() -> None:
    z = np.array([1e4, 9999.5, -1e4], np.float32)
    sig = 1 / (1 + np.exp(-0.5))
    np.testing.assert_allclose(softmax(z), [sig, 1 - sig, 0], rtol=1e-6)
    np.testing.assert_allclose(sparsemax(z), [0.75, 0.25, 0], rtol=1e-6)
    t = (0.5 + np.sqrt(7.75)) / 4  # -tau of entmax15 for z' = [0, -0.25]
    np.testing.assert_allclose(entmax15(z), [t**2, (t - 0.25) ** 2, 0], rtol=1e-6)
    with np.errstate(**RAISE_ON_INVALID):
        ls = log_softmax(z)
    np.testing.assert_allclose(ls, [np.log(sig), np.log(1 - sig), -2e4 + np.log(sig)], rtol=1e-6)


# --------------------------------------------------------------------------- in place


def _softmax_reference(z: np.ndarray) -> np.ndarray:
    z = z.astype(np.float64)
    m = np.max(np.where(np.isfinite(z), z, -1e300), axis=-1, keepdims=True)
    m[m == -1e300] = 0.0
    e = np.where(np.isfinite(z), np.exp(np.where(np.isfinite(z), z, 0) - m), 0.0)
    s = e.sum(-1, keepdims=True)
    return e / np.where(s == 0, 1, s)


def test_softmax_in_place_hot_path() -> None:
    rng = np.random.default_rng(11)
    z = (rng.normal(size=(12 * 8, 64)) * 4).astype(np.float32)
    z[rng.random(z.shape) < 0.3] = -np.inf
    z[5] = -np.inf
    expected = _softmax_reference(z)
    with np.errstate(**RAISE_ON_INVALID):
        res = normalize(z, "softmax", out=z)
    assert res is z and z.dtype == np.float32
    np.testing.assert_allclose(z, expected, atol=1e-6)
    assert np.array_equal(z[5], np.zeros(64, np.float32))


def test_softmax_in_place_allocates_no_full_size_temporaries() -> None:
    z = np.random.default_rng(12).normal(size=(12 * 64, 512)).astype(np.float32)
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        normalize(z, "softmax", out=z)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < z.nbytes // 10, (peak, z.nbytes)


def test_softmax_out_other_array_and_axis() -> None:
    z = np.random.default_rng(13).normal(size=(6, 7))
    z_before = z.copy()
    out = np.empty_like(z)
    assert softmax(z, out=out) is out
    assert np.array_equal(z, z_before)
    np.testing.assert_allclose(out, _softmax_reference(z), rtol=1e-12)
    zt = z.T.copy()
    assert normalize(zt, "softmax", axis=0, out=zt) is zt
    np.testing.assert_allclose(zt, out.T, rtol=1e-12)
    with pytest.raises(ValueError):
        softmax(z, out=np.empty((7, 6)))


@pytest.mark.parametrize("name", NORMALIZER_NAMES)
def test_out_for_every_normalizer(name: str) -> None:
    z = ROWS.copy()
    expected = normalize(ROWS, name, **NAMED[name])
    assert normalize(z, name, out=z, **NAMED[name]) is z
    np.testing.assert_allclose(z, expected, rtol=1e-12)


# --------------------------------------------------------------------------- properties


def _check_simplex(p: np.ndarray, z: np.ndarray, label: str, tol: float) -> None:
    assert np.all(p >= 0) and np.all(np.isfinite(p))
    assert np.all(p[z == -np.inf] == 0)
    has_mass = bool((z > 0).any()) if label == "relu" else with_a_finite(z)
    if has_mass:
        assert abs(float(p.sum()) - 1.0) <= tol
    else:
        assert np.all(p == 0)


@FAST
@given(z=rows())
def test_prop_on_simplex_float64(z: np.ndarray) -> None:
    for label, f in FORWARDS.items():
        _check_simplex(f(z), z, label, 1e-12)


@FAST
@given(z=rows(np.float32))
def test_prop_on_simplex_float32(z: np.ndarray) -> None:
    for label, f in FORWARDS.items():
        p = f(z)
        assert p.dtype == np.float32, label
        _check_simplex(p, z, label, 1e-5)
        # agrees with the float64 computation on the same inputs
        np.testing.assert_allclose(p, f(z.astype(np.float64)), atol=2e-6, err_msg=label)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@FAST
@given(data=st.data())
def test_prop_masking_equals_removing(dtype: type, data: st.DataObject) -> None:
    z = data.draw(rows(dtype, masked=False))
    drop = data.draw(hnp.arrays(np.bool_, z.shape))
    masked = z.copy()
    masked[drop] = -np.inf
    tol = 1e-12 if dtype == np.float64 else 1e-6
    for label, f in FORWARDS.items():
        p = f(masked)
        assert np.all(p[drop] == 0), label
        if drop.all():
            assert np.all(p == 0), label
        else:
            np.testing.assert_allclose(p[~drop], f(z[~drop]), atol=tol, err_msg=label)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@FAST
@given(data=st.data())
def test_prop_shift_invariance(dtype: type, data: st.DataObject) -> None:
    z = data.draw(rows(dtype))
    c = data.draw(st.floats(-50, 50, width=32 if dtype == np.float32 else 64))
    shifted = (z + dtype(c)).astype(dtype)
    tol = 1e-9 if dtype == np.float64 else 1e-4
    for label in SHIFT_INVARIANT:
        f = FORWARDS[label]
        np.testing.assert_allclose(f(shifted), f(z), atol=_shift_tolerance(label, z, c, tol), err_msg=label)


def _shift_tolerance(label: str, z: np.ndarray, c: float, tol: float) -> float:
    """The shift rounds each score by up to one ulp of ``|z| + |c|``. For alpha > 2 the weights are
    ``(x - tau)^(1/(alpha-1))`` with an exponent below 1, so at the edge of the support that rounding
    grows to its ``1/(alpha-1)``-th power (alpha 3, z = [0.5, 2.2e-16], c = 2: 1e-8 in float64).
    """
    alpha = ALPHAS.get(label)
    if alpha is None or alpha <= 2:
        return tol
    finite = z[np.isfinite(z)]
    scale = (float(np.abs(finite).max()) if finite.size else 0.0) + abs(c) + 1.0
    rounding = (alpha - 1) * float(np.finfo(z.dtype).eps) * scale
    return max(tol, 4.0 * rounding ** (1.0 / (alpha - 1)))


@FAST
@given(data=st.data())
def test_prop_permutation_equivariance(data: st.DataObject) -> None:
    z = data.draw(rows())
    perm = np.array(data.draw(st.permutations(range(z.size))), dtype=np.intp)
    for label, f in FORWARDS.items():
        np.testing.assert_allclose(f(z[perm]), f(z)[perm], atol=1e-12, err_msg=label)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_prop_sort_based_equals_bisection(dtype: type, data: st.DataObject) -> None:
    scale = data.draw(st.sampled_from([1.0, 0.1, 0.02]))  # small scales: large supports
    z = (data.draw(rows(dtype)) * dtype(scale)).astype(dtype)
    tol = 1e-9 if dtype == np.float64 else 1e-6
    np.testing.assert_allclose(sparsemax(z), entmax_bisect(z, 2.0), atol=tol)
    np.testing.assert_allclose(entmax15(z), entmax_bisect(z, 1.5), atol=tol)


# --------------------------------------------------------------------------- gradients


H = 1e-6


def _numeric_vjp(f: Forward, z: np.ndarray, g: np.ndarray) -> np.ndarray:
    """Central finite differences of <g, f(z)> w.r.t. the finite entries of z.

    All perturbed rows go through ``f`` as one batch (row-wise independence of
    the normalizers is tested elsewhere).
    """
    idx = np.flatnonzero(np.isfinite(z))
    out = np.zeros_like(z)
    if idx.size == 0:
        return out
    step = np.zeros((idx.size, z.size))
    step[np.arange(idx.size), idx] = H
    p_plus, p_minus = f(z + step), f(z - step)  # -inf + 0 stays -inf
    out[idx] = ((p_plus - p_minus) @ g) / (2 * H)
    return out


def _support_margin(z: np.ndarray, p: np.ndarray, alpha: float) -> float:
    """Smallest |(alpha-1) z_i - tau| over finite i: distance to a support change."""
    if not with_a_finite(z):
        return np.inf
    x = (alpha - 1.0) * (z[np.isfinite(z)] - z[np.isfinite(z)].max())
    tau = -(p.max() ** (alpha - 1.0))  # at the argmax, x = 0 and p^(alpha-1) = -tau
    return float(np.min(np.abs(x - tau)))


@st.composite
def grad_case(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray]:
    scale = draw(st.sampled_from([1.0, 0.1, 0.02]))
    z = draw(rows()) * scale
    g = draw(hnp.arrays(np.float64, z.shape, elements=st.floats(-5, 5)))
    return z, g


def test_softmax_backward_finite_differences_fixed() -> None:
    z = np.array([0.3, -1.2, 2.0, 0.0, -np.inf, 1.1])
    g = np.array([1.0, -2.0, 0.5, 3.0, 7.0, -1.0])
    dz = softmax_backward(softmax(z), g)
    np.testing.assert_allclose(dz, _numeric_vjp(softmax, z, g), atol=1e-8)
    assert dz[4] == 0
    np.testing.assert_allclose(dz.sum(), 0.0, atol=1e-12)


@pytest.mark.parametrize(
    "label, alpha", [("sparsemax", 2.0), ("entmax15", 1.5), ("bisect_1.25", 1.25), ("bisect_3", 3.0)]
)
def test_sparse_backward_finite_differences_fixed(label: str, alpha: float) -> None:
    # well separated from the support boundary, with 2 to 3 entries in the support
    z = np.array([0.4, -1.5, 0.9, -np.inf, 0.1, -3.0]) / (2.0 * (alpha - 1.0))
    g = np.array([1.0, -2.0, 0.5, 9.0, 3.0, -1.0])
    f = FORWARDS[label]
    p = f(z)
    assert _support_margin(z, p, alpha) > 5e-3
    assert (p > 0).sum() >= 2
    dz = entmax_backward(p, g, alpha)
    np.testing.assert_allclose(dz, _numeric_vjp(f, z, g), atol=1e-6)
    assert np.all(dz[p == 0] == 0)


@FAST
@given(case=grad_case())
def test_prop_softmax_backward_finite_differences(case: tuple[np.ndarray, np.ndarray]) -> None:
    z, g = case
    dz = softmax_backward(softmax(z), g)
    np.testing.assert_allclose(dz, _numeric_vjp(softmax, z, g), atol=1e-6)
    np.testing.assert_allclose(normalize_backward("softmax", softmax(z), g), dz)


@FAST
@given(case=grad_case())
def test_prop_entmax_family_backward_finite_differences(
    case: tuple[np.ndarray, np.ndarray],
) -> None:
    z, g = case
    checked = 0
    for label, alpha in ALPHAS.items():
        f = FORWARDS[label]
        p = f(z)
        if _support_margin(z, p, alpha) <= 1e-2:
            continue  # too close to a support change for finite differences
        checked += 1
        dz = entmax_backward(p, g, alpha)
        np.testing.assert_allclose(dz, _numeric_vjp(f, z, g), atol=1e-5, err_msg=label)
        assert np.all(dz[p == 0] == 0), label
        if alpha == 2.0:
            np.testing.assert_allclose(sparsemax_backward(p, g), dz, atol=1e-12)
            np.testing.assert_allclose(normalize_backward("sparsemax", p, g), dz, atol=1e-12)
        if label == "entmax15":
            np.testing.assert_allclose(normalize_backward("entmax15", p, g), dz, atol=1e-12)
    assume(checked > 0)


@FAST
@given(case=grad_case())
def test_prop_relu_backward_finite_differences(case: tuple[np.ndarray, np.ndarray]) -> None:
    z, g = case
    finite = z[np.isfinite(z)]
    assume(finite.size == 0 or np.min(np.abs(finite)) > 1e-2)
    s = np.maximum(finite, 0).sum()
    assume(s == 0 or s > 0.1)
    dz = relu_backward(z, g)
    np.testing.assert_allclose(dz, _numeric_vjp(relu_normalize, z, g), atol=1e-5)
    np.testing.assert_allclose(normalize_backward("relu", relu_normalize(z), g, z=z), dz)
    assert np.all(dz[~(z > 0)] == 0)


def test_relu_backward_fixed() -> None:
    z = np.array([[2.0, -1.0, 1.0, 0.5], [-1.0, -2.0, -np.inf, -0.1]])
    g = np.array([[1.0, 4.0, -1.0, 2.0], [1.0, 2.0, 3.0, 4.0]])
    dz = relu_backward(z, g)
    np.testing.assert_allclose(dz[0], _numeric_vjp(relu_normalize, z[0], g[0]), atol=1e-8)
    # closed form: (g_j - <g, p>) / s on z_j > 0, with s = 3.5 and p = z+ / s
    gp = (2.0 * 1.0 + 1.0 * -1.0 + 0.5 * 2.0) / 3.5
    np.testing.assert_allclose(dz[0], [(1 - gp) / 3.5, 0, (-1 - gp) / 3.5, (2 - gp) / 3.5])
    assert np.array_equal(dz[1], np.zeros(4))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_backward_preserves_dtype_and_axis(dtype: type) -> None:
    rng = np.random.default_rng(5)
    z = rng.normal(size=(4, 6)).astype(dtype)
    g = rng.normal(size=(4, 6)).astype(dtype)
    for name in NORMALIZER_NAMES:
        kw = dict(NAMED[name])
        p = normalize(z, name, **kw)
        dz = normalize_backward(name, p, g, z=z, **kw)
        assert dz.dtype == dtype
        p_t = normalize(z.T, name, axis=0, **kw)
        dz_t = normalize_backward(name, p_t, g.T, z=z.T, axis=0, **kw)
        np.testing.assert_allclose(dz_t, dz.T, atol=1e-5)
