"""Attention rollout (service/core/rollout.py): vit-explain's golden cases, a plain reference for every option, the
rows form against the full product, the edges (fully masked rows, the protected first weight) and the refusals.
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest

from service.core.errors import InvalidInput
from service.core.rollout import (
    RolloutParams,
    check_top_k,
    layer_fused,
    resolve_rows,
    rollout,
    row_sum_tolerance,
    top_keys,
)
from tests.golden import load

CASES = load("rollout")
RNG = np.random.default_rng(31)


def params(**kw: Any) -> RolloutParams:
    return RolloutParams(**{"tolerance": 1e-9, **kw})


def reference(
    weights: np.ndarray,
    gradients: np.ndarray | None = None,
    head_fusion: str = "mean",
    residual: float = 0.5,
    discard_ratio: float = 0.0,
    renormalize: bool = False,
) -> np.ndarray:
    """The definitions written out plainly (one batch entry, one layer at a time, the product from the right)."""
    w = np.asarray(weights, dtype=np.float64)
    layers, batch, _, length, _ = w.shape
    out = np.empty((batch, length, length))
    for b in range(batch):
        result = np.eye(length)
        for layer in range(layers):
            a = w[layer, b].copy()
            if renormalize:
                sums = a.sum(axis=-1, keepdims=True)
                a = np.where(sums > 0, a / np.where(sums > 0, sums, 1), 0.0)
            if gradients is not None:
                fused = np.maximum(np.asarray(gradients[layer, b], dtype=np.float64) * a, 0).mean(axis=0)
            else:
                fused = {"mean": a.mean(axis=0), "max": a.max(axis=0), "min": a.min(axis=0)}[head_fusion]
            flat = fused.reshape(-1)
            lowest = np.argsort(flat, kind="stable")[: int(length * length * discard_ratio)]
            flat[lowest[lowest != 0]] = 0.0
            hat = residual * np.eye(length) + (1 - residual) * fused
            sums = hat.sum(axis=-1, keepdims=True)
            hat = np.where(sums > 0, hat / np.where(sums > 0, sums, 1), 0.0)
            result = hat @ result
        out[b] = result
    return out


def stack(layers: int, batch: int, heads: int, length: int, *, zero_rows: bool = False) -> np.ndarray:
    logits = RNG.standard_normal((layers, batch, heads, length, length)) * 2
    w = np.exp(logits - logits.max(axis=-1, keepdims=True))
    w /= w.sum(axis=-1, keepdims=True)
    if zero_rows:
        w[0, :, :, length // 2] = 0.0
    return w


# ------------------------------------------------------------------------------------------------ golden cases


@pytest.mark.parametrize("i", range(len(CASES)))
def test_golden_case_in_float64(i: int) -> None:
    case = CASES[i]
    dtype = np.dtype(case["dtype"])  # float32 cases: float32 values, the reference computed from exactly those
    gradients = None if case["gradients"] is None else np.array(case["gradients"], dtype=dtype)
    p = params(
        head_fusion=case["head_fusion"],
        discard_ratio=case["discard_ratio"],
        tolerance=row_sum_tolerance(dtype, np.dtype(np.float64)),
    )
    got = rollout(np.array(case["weights"], dtype=dtype), gradients, p)
    np.testing.assert_allclose(got, np.array(case["expected"]), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("i", range(len(CASES)))
def test_golden_case_in_float32(i: int) -> None:
    case = CASES[i]
    gradients = None if case["gradients"] is None else np.array(case["gradients"], dtype=np.float32)
    weights = np.array(case["weights"], dtype=np.float32)
    p = params(head_fusion=case["head_fusion"], discard_ratio=case["discard_ratio"], tolerance=1e-5)
    got = rollout(weights, gradients, p).astype(np.float32)
    np.testing.assert_allclose(got, np.array(case["expected"]), rtol=1e-6, atol=1e-6)


def test_the_golden_cases_cover_the_options() -> None:
    assert {c["head_fusion"] for c in CASES} == {"mean", "max", "min"}
    assert sum(c["gradients"] is not None for c in CASES) >= 8
    assert sum(c["discard_ratio"] > 0 for c in CASES) >= 8 and {c["dtype"] for c in CASES} == {"float32", "float64"}
    assert any((np.array(c["weights"]).sum(axis=-1) == 0).any() for c in CASES)  # a fully masked query row


# ------------------------------------------------------------------------------------------------ every option


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"head_fusion": "max"},
        {"head_fusion": "min", "discard_ratio": 0.7},
        {"residual": 0.0},
        {"residual": 0.2, "discard_ratio": 0.4},
        {"residual": 1.0},
        {"discard_ratio": 1.0},
        {"renormalize": True},
    ],
    ids=repr,
)
def test_every_option_against_the_plain_definition(options: dict[str, Any]) -> None:
    w = stack(3, 3, 4, 7, zero_rows=True)
    if options.get("renormalize"):
        w = w * RNG.uniform(0.2, 3.0, size=w.shape[:-1] + (1,))  # rows summing to anything
    np.testing.assert_allclose(rollout(w, None, params(**options)), reference(w, **options), rtol=1e-12, atol=1e-13)


def test_gradient_weighted_form_against_the_plain_definition() -> None:
    w, g = stack(4, 2, 3, 6), RNG.standard_normal((4, 2, 3, 6, 6))
    for discard in (0.0, 0.5):
        got = rollout(w, g, params(discard_ratio=discard))
        np.testing.assert_allclose(got, reference(w, g, discard_ratio=discard), rtol=1e-12, atol=1e-13)
    # Chefer et al.: the positive part before the mean; vit-explain's grad_rollout takes it after, which differs
    fused = layer_fused(w[0], g[0], 0, params())
    np.testing.assert_allclose(fused, np.maximum(g[0] * w[0], 0).mean(axis=1), rtol=1e-14, atol=1e-16)
    assert not np.allclose(fused, np.maximum((g[0] * w[0]).mean(axis=1), 0))


def test_rows_of_the_rollout_sum_to_one() -> None:
    """Each A_hat is row-stochastic, so the rollout is: vit-explain's a / a.sum(dim=-1) (the wrong axis) is not."""
    w = stack(5, 2, 3, 8, zero_rows=True)
    np.testing.assert_allclose(rollout(w, None, params()).sum(axis=-1), 1.0, rtol=0, atol=1e-13)
    fused = w[0, 0].mean(axis=0) / 2 + np.eye(8) / 2
    wrong_axis = fused / fused.sum(axis=-1)  # vit-explain's division: column j by row j's sum
    assert np.abs(wrong_axis.sum(axis=-1) - 1).max() > 1e-3


def test_batch_entries_are_independent_and_each_is_discarded() -> None:
    w = stack(3, 4, 2, 5)
    together = rollout(w, None, params(discard_ratio=0.5))
    for b in range(4):
        alone = rollout(w[:, b : b + 1], None, params(discard_ratio=0.5))
        np.testing.assert_allclose(together[b : b + 1], alone, rtol=0, atol=0)
    assert not np.allclose(together[1:], rollout(w, None, params())[1:])  # discarded beyond batch entry 0


# ------------------------------------------------------------------------------------------------ rows


@pytest.mark.parametrize("seed", range(6))
def test_rows_agree_with_the_full_product(seed: int) -> None:
    rng = np.random.default_rng(seed)
    layers, batch, heads, length = (int(x) for x in rng.integers(1, 6, size=4) + np.array([0, 0, 0, 3]))
    w = stack(layers, batch, heads, length)
    options = {"head_fusion": str(rng.choice(["mean", "max", "min"])), "discard_ratio": float(rng.random() * 0.8)}
    full = rollout(w, None, params(**options))
    count = int(rng.integers(1, length + 1))
    rows = [int(r) - (length if rng.random() < 0.5 else 0) for r in rng.choice(length, count, replace=False)]
    got = rollout(w, None, params(**options), resolve_rows(rows, length))
    np.testing.assert_allclose(got, full[:, [r % length for r in rows]], rtol=1e-12, atol=1e-14)


def test_on_a_pool_the_same_numbers() -> None:
    w, g = stack(4, 1, 4, 160), RNG.standard_normal((4, 1, 4, 160, 160))
    with ThreadPoolExecutor(3) as pool:
        for gradients, rows in ((None, None), (g, None), (None, resolve_rows([0, -1, 5], 160))):
            alone = rollout(w, gradients, params(), rows)
            pooled = rollout(w, gradients, params(), rows, executor=pool, workers=3)
            np.testing.assert_allclose(pooled, alone, rtol=1e-13, atol=1e-15)


# ------------------------------------------------------------------------------------------------ edges


def test_a_fully_masked_row_becomes_the_identity_row() -> None:
    w = np.array([[[[[1.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.25, 0.25, 0.5]]]]])  # row 1 fully masked
    got = rollout(w, None, params())
    np.testing.assert_array_equal(got[0, 1], [0.0, 1.0, 0.0])
    np.testing.assert_allclose(got[0, 2], [0.125, 0.125, 0.75], rtol=0, atol=1e-16)
    assert rollout(w, None, params(residual=0.0))[0, 1].tolist() == [0.0, 0.0, 0.0]  # nothing to renormalise


def test_the_first_tokens_own_weight_is_never_discarded() -> None:
    w = np.array([[[[[0.1, 0.9], [0.5, 0.5]]]]])
    # k = 1: the lowest entry is [0, 0], protected: one entry fewer, none discarded
    np.testing.assert_array_equal(rollout(w, None, params(discard_ratio=0.25)), rollout(w, None, params()))
    # k = 2: [0, 0] and the lower index of the tie at 0.5, [1, 0]: fused [[0.1, 0.9], [0, 0.5]]
    got = rollout(w, None, params(discard_ratio=0.5))
    np.testing.assert_allclose(got[0], [[0.55, 0.45], [0.0, 1.0]], rtol=0, atol=1e-15)


def test_head_fusions_on_a_worked_example() -> None:
    heads = [[[1.0, 0.0], [0.2, 0.8]], [[1.0, 0.0], [0.6, 0.4]]]
    w = np.array([[heads]])
    # row 1 fused: mean [0.4, 0.6], max [0.6, 0.8], min [0.2, 0.4]; then 0.5 * I + 0.5 * fused, renormalised
    for fusion, row in (("mean", [0.2, 0.8]), ("max", [0.25, 0.75]), ("min", [0.125, 0.875])):
        got = rollout(w, None, params(head_fusion=fusion))
        np.testing.assert_allclose(got[0, 1], row, rtol=0, atol=1e-15)


def test_tolerance_is_the_coarser_of_sent_and_computed() -> None:
    f16, f32, f64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
    assert row_sum_tolerance(f16, f64) == 1e-3 and row_sum_tolerance(f32, f64) == 1e-5
    assert row_sum_tolerance(f64, f32) == 1e-5 and row_sum_tolerance(f64, f64) == 1e-9
    w = np.array([[[[[0.5, 0.5004], [0.5, 0.5]]]]])  # row 0 sums to 1.0004
    assert rollout(w.astype(np.float16), None, params(tolerance=1e-3)).shape == (1, 2, 2)
    with pytest.raises(InvalidInput, match="sums to 1.0004"):
        rollout(w, None, params(tolerance=1e-5))


# ------------------------------------------------------------------------------------------------ refusals


def refusal(weights: np.ndarray, gradients: np.ndarray | None = None, **options: Any) -> InvalidInput:
    with pytest.raises(InvalidInput) as err:
        rollout(weights, gradients, params(**options))
    return err.value


def test_refusals_name_the_layer_batch_head_and_row() -> None:
    w = stack(3, 2, 2, 4)
    bad = w.copy()
    bad[1, 1, 0, 2, 3] = -0.25
    err = refusal(bad)
    assert err.loc == ("weights", 1, 1, 0, 2, 3)
    assert str(err) == (
        "weights[1, 1, 0, 2, 3] (layer 1, batch 1, head 0, row 2) = -0.25 is negative: attention weights are >= 0"
    )
    for value, word in ((np.nan, "nan"), (np.inf, "inf"), (-np.inf, "-inf")):
        bad = w.copy()
        bad[2, 0, 1, 3, 1] = value
        err = refusal(bad)
        assert err.loc == ("weights", 2, 0, 1, 3, 1) and f"is {word}; values must be finite" in str(err)
    bad = w.copy()
    bad[0, 1, 1, 2] *= 0.9
    err = refusal(bad)
    assert err.loc == ("weights", 0, 1, 1, 2)
    assert str(err).startswith("weights[0, 1, 1, 2] (layer 0, batch 1, head 1, row 2) sums to 0.9, neither 1")
    assert "renormalize" in str(err)
    assert rollout(bad, None, params(renormalize=True)).shape == (2, 4, 4)
    grads = RNG.standard_normal(w.shape)
    grads[1, 0, 1, 0, 2] = np.nan
    err = refusal(w, grads)
    assert err.loc == ("gradients", 1, 0, 1, 0, 2) and "gradients[1, 0, 1, 0, 2]" in str(err)


def test_refusals_of_options_and_rows() -> None:
    w, g = stack(1, 1, 2, 3), RNG.standard_normal((1, 1, 2, 3, 3))
    assert refusal(w, g, head_fusion="max").loc == ("head_fusion",)
    assert refusal(w, residual=1.5).loc == ("residual",)
    assert refusal(w, discard_ratio=-0.1).loc == ("discard_ratio",)
    assert refusal(w, head_fusion="median").loc == ("head_fusion",)
    for rows, loc, words in (
        ([0, 3], ("rows", 1), "rows[1] = 3 is out of range: the weights have L = 3 rows, indices -3 to 2"),
        ([-4], ("rows", 0), "rows[0] = -4 is out of range"),
        ([2, -1], ("rows", 1), "rows[1] = -1 is row 2 again (rows[0])"),
        ([], ("rows",), "rows is empty"),
    ):
        with pytest.raises(InvalidInput, match=re.escape(words)) as err:
            resolve_rows(rows, 3)
        assert err.value.loc == loc


# ------------------------------------------------------------------------------------------------ top keys


def _top_reference(rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Each row's ``k`` largest entries by Python's ``sorted`` (a key of (-value, index): largest first, equal
    values by index), one row at a time: an algorithm independent of the numpy sort the service uses.
    """
    flat = rows.reshape(-1, rows.shape[-1])
    keys = np.array([[j for _, j in sorted((-v, j) for j, v in enumerate(row))[:k]] for row in flat.tolist()])
    shape = (*rows.shape[:-1], k)
    return keys.reshape(shape), np.take_along_axis(flat, keys, axis=-1).reshape(shape)


@pytest.mark.parametrize("k", [1, 3, 8])
def test_top_keys_against_a_plain_sort(k: int) -> None:
    weights = RNG.dirichlet(np.ones(8), size=(2, 1, 3, 8))[:, :, :, :, :]  # [2 layers, 1, 3 heads, 8, 8]
    whole = rollout(weights, None, params())
    rows = np.round(whole, 2)  # rounded: many equal entries, so the tie rule is exercised
    keys, values = top_keys(rows, k)
    want_keys, want_values = _top_reference(rows, k)
    assert keys.dtype == np.int64 and keys.shape == values.shape == (1, 8, k)
    np.testing.assert_array_equal(keys, want_keys)
    np.testing.assert_array_equal(values, want_values)


def test_top_keys_ties_go_to_the_lower_index_and_k_equal_to_length_is_a_full_sort() -> None:
    rows = np.array([[[0.25, 0.5, 0.25, 0.0], [0.0, 0.0, 0.0, 0.0]]])
    keys, values = top_keys(rows, 2)
    np.testing.assert_array_equal(keys, [[[1, 0], [0, 1]]])
    np.testing.assert_array_equal(values, [[[0.5, 0.25], [0.0, 0.0]]])
    keys, _ = top_keys(rows, 4)
    np.testing.assert_array_equal(keys, [[[1, 0, 2, 3], [0, 1, 2, 3]]])


@pytest.mark.parametrize("k", [0, -1, 5])
def test_top_k_outside_one_to_length_is_refused_naming_it(k: int) -> None:
    with pytest.raises(InvalidInput, match=re.escape(f"top_k {k} is outside [1, 4]")) as info:
        check_top_k(k, 4)
    assert info.value.loc == ("top_k",)
