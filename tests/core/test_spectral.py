"""The per-head spectral norm (service.core.diagnostics.spectral) against numpy's SVD of the whole logits matrix in
float64, within the stated tolerance: 1e-6 relative for float32 requests (the iteration's 5e-7 and the float32
Gram matrices' rounding), 1e-10 for float64 (the iteration's 5e-11, never above the SVD's value beyond rounding),
1e-12 where the answer is exact.
"""

from __future__ import annotations

import numpy as np
import pytest

from service.core.diagnostics import spectral
from service.core.diagnostics.spectral import spectral_norms

FLOAT32 = 1e-6
FLOAT64 = 1e-10


def svd_norms(q: np.ndarray, k: np.ndarray, factor: float, lengths: np.ndarray | None = None) -> np.ndarray:
    """The reference: the largest singular value of every head's materialized logits, in float64."""
    B, Hq = q.shape[:2]
    group = Hq // k.shape[1]
    out = np.zeros((B, Hq))
    for b in range(B):
        n = k.shape[2] if lengths is None else int(lengths[b])
        for h in range(Hq):
            logits = q[b, h].astype(np.float64) @ k[b, h // group, :n].astype(np.float64).T * factor
            out[b, h] = np.linalg.norm(logits, 2) if n else 0.0
    return out


def assert_within(got: np.ndarray, want: np.ndarray, dtype: type) -> None:
    """``got`` within the stated tolerance of ``want``: float64 from below only (a Rayleigh quotient), 5e-11."""
    if dtype == np.float64:
        assert np.all(got <= want * (1 + 1e-13) + 1e-300)
        np.testing.assert_array_less(want * (1 - FLOAT64 / 2) - 1e-300, got + (want == 0))
    else:
        np.testing.assert_allclose(got, want, rtol=FLOAT32, atol=0)


def test_the_stated_tolerances() -> None:
    assert spectral.tolerance(np.float32) == FLOAT32 == spectral.TOLERANCE_FLOAT32
    assert spectral.tolerance(np.float16) == FLOAT32
    assert spectral.tolerance(np.float64) == FLOAT64 == spectral.TOLERANCE_FLOAT64


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(
    ("B", "Hq", "Hkv", "L", "S", "E"),
    [
        (1, 8, 8, 128, 128, 64),  # L, S > E
        (2, 4, 4, 40, 48, 64),  # L, S < E (singular Gram matrices)
        (2, 8, 2, 96, 70, 64),  # GQA
        (1, 3, 1, 200, 60, 40),
        (1, 2, 2, 50, 300, 33),  # just above the exact routes
    ],
)
def test_iterated_heads_within_the_stated_tolerance(B, Hq, Hkv, L, S, E, dtype) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(B * 1000 + L + S + E)
    q = rng.standard_normal((B, Hq, L, E)).astype(dtype)
    k = (rng.standard_normal((B, Hkv, S, E)) * 2.0).astype(dtype)
    assert min(L, S, E) > spectral.SMALL
    assert_within(spectral_norms(q, k, 0.3), svd_norms(q, k, 0.3), dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_key_lengths_including_none_and_few(dtype) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(7)
    q = rng.standard_normal((4, 4, 80, 48)).astype(dtype)
    k = rng.standard_normal((4, 2, 90, 48)).astype(dtype)
    lengths = np.array([90, 0, 3, 41])  # all, none (norm 0), fewer keys than E
    got = spectral_norms(q, k, 0.125, lengths)
    assert np.all(got[1] == 0.0)
    assert_within(got, svd_norms(q, k, 0.125, lengths), dtype)


def heads_with_singular_values(values: np.ndarray, L: int, S: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """One head whose logits ``Q K^T`` have the singular values ``values`` (``E`` of them): ``Q = U diag(values)``,
    ``K = W`` with ``U``, ``W`` orthonormal columns.
    """
    rng = np.random.default_rng(seed)
    E = values.size
    u = np.linalg.qr(rng.standard_normal((L, E)))[0]
    w = np.linalg.qr(rng.standard_normal((S, E)))[0]
    return (u * values)[None, None], w[None, None]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(
    "top",
    [
        [5.0, 5.0],  # two equal top singular values
        [5.0, 5.0, 5.0],
        [5.0, 4.9999],  # closer than the iteration resolves cheaply: the exact fallback where it stalls
        [5.0, 4.99],
        [5.0],  # rank 1 below
    ],
)
def test_equal_and_close_top_singular_values(top, dtype) -> None:  # type: ignore[no-untyped-def]
    values = np.concatenate([top, np.linspace(4.5, 0.1, 48 - len(top))])
    if top == [5.0]:
        values[1:] = 0.0
    q, k = heads_with_singular_values(values, 96, 80, seed=len(top))
    got = spectral_norms(q.astype(dtype), k.astype(dtype), 1.0)
    assert_within(got, svd_norms(q.astype(dtype), k.astype(dtype), 1.0), dtype)
    assert got[0, 0] == pytest.approx(5.0, rel=FLOAT32)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_low_rank_and_degenerate_heads(dtype) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(11)
    L, S, E = 64, 64, 48
    q = rng.standard_normal((1, 5, L, E))
    k = rng.standard_normal((1, 5, S, E))
    q[0, 0] = np.outer(rng.standard_normal(L), rng.standard_normal(E))  # rank 1 queries
    k[0, 1] = np.outer(rng.standard_normal(S), rng.standard_normal(E))  # rank 1 keys
    q[0, 2] = q[0, 2, :1]  # one query repeated: a singular Gram matrix
    q[0, 3] = 0.0  # all-zero queries
    k[0, 4] = 0.0  # all-zero keys
    q, k = q.astype(dtype), k.astype(dtype)
    got = spectral_norms(q, k, 0.5)
    assert got[0, 3] == 0.0 and got[0, 4] == 0.0
    assert_within(got, svd_norms(q, k, 0.5), dtype)


@pytest.mark.parametrize(
    ("L", "S", "E"),
    [(1, 300, 64), (300, 1, 64), (5, 200, 64), (200, 7, 64), (32, 32, 64), (100, 90, 32), (6, 9, 4), (1, 1, 3)],
)
def test_the_exact_routes_of_small_heads(L, S, E) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(L + S + E)
    q = rng.standard_normal((2, 4, L, E))
    k = rng.standard_normal((2, 2, S, E))
    lengths = np.array([S, max(S // 2, 1)])
    assert min(L, S, E) <= spectral.SMALL
    np.testing.assert_allclose(
        spectral_norms(q, k, 0.2, lengths), svd_norms(q, k, 0.2, lengths), rtol=1e-12, atol=1e-300
    )


def test_the_exact_fallback_when_the_iteration_is_capped() -> None:
    rng = np.random.default_rng(3)
    q = rng.standard_normal((2, 6, 100, 64))
    k = rng.standard_normal((2, 3, 120, 64))
    lengths = np.array([120, 50])
    want = svd_norms(q, k, 0.7, lengths)
    # no squaring allowed: every head by the exact route, to rounding
    np.testing.assert_allclose(spectral_norms(q, k, 0.7, lengths, max_squarings=0), want, rtol=1e-12)
    # one check only: the heads that met the rule there, the rest by the exact route; all within the tolerance
    capped = spectral_norms(q, k, 0.7, lengths, max_squarings=spectral.FIRST_CHECK)
    assert_within(capped, want, np.float64)
    assert_within(spectral_norms(q, k, 0.7, lengths), want, np.float64)


def test_deterministic_and_independent_of_the_batch() -> None:
    rng = np.random.default_rng(5)
    q = rng.standard_normal((2, 8, 128, 64)).astype(np.float32)
    k = rng.standard_normal((2, 4, 128, 64)).astype(np.float32)
    first = spectral_norms(q, k, 0.125)
    np.testing.assert_array_equal(spectral_norms(q, k, 0.125), first)
    np.testing.assert_array_equal(spectral_norms(q.copy(), k.copy(), 0.125), first)
    alone = spectral_norms(q[1:, 2:4], k[1:, 1:2], 0.125)
    np.testing.assert_allclose(alone, first[1:, 2:4], rtol=FLOAT32)


@pytest.mark.parametrize("factor", [1e-30, 1e-3, -2.0, 1e30])
def test_the_factor_scales_the_norm(factor: float) -> None:
    rng = np.random.default_rng(9)
    q = rng.standard_normal((1, 2, 70, 64))
    k = rng.standard_normal((1, 2, 70, 64))
    unit = spectral_norms(q, k, 1.0)
    np.testing.assert_allclose(spectral_norms(q, k, factor), unit * abs(factor), rtol=1e-15)
    assert_within(unit, svd_norms(q, k, 1.0), np.float64)


def test_float16_requests_work_in_float32() -> None:
    rng = np.random.default_rng(13)
    q = rng.standard_normal((1, 2, 64, 48)).astype(np.float16)
    k = rng.standard_normal((1, 2, 64, 48)).astype(np.float16)
    got = spectral_norms(q, k, 0.25)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, svd_norms(q, k, 0.25), rtol=FLOAT32)


@pytest.mark.parametrize(("L", "S", "E"), [(5, 0, 8), (40, 0, 64), (0, 5, 8), (5, 5, 0)])
def test_empty_axes_give_0(L: int, S: int, E: int) -> None:
    got = spectral_norms(np.ones((2, 2, L, E)), np.ones((2, 1, S, E)), 0.5)
    np.testing.assert_array_equal(got, np.zeros((2, 2)))
