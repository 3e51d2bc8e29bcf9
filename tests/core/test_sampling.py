"""service.core.sampling: the golden cases, the spec's reference numbers, draws and properties."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.core import normalizers
from service.core import sampling as S
from service.core.errors import InvalidInput
from tests import golden

ROW2 = np.array([2.1, 0.5, -1.2, 3.0])


def final(logits, mask=None, previous_tokens=None, dtype=np.float64, **params) -> np.ndarray:
    """The final distribution, the logits' shape."""
    arr = np.asarray(logits)
    filtered, _ = S.process(
        arr,
        S.SamplingParams(**params),
        mask=None if mask is None else np.asarray(mask),
        previous_tokens=previous_tokens,
        dtype=dtype,
    )
    return filtered.dense(dtype).reshape(arr.shape)


def split(request: dict) -> tuple[np.ndarray, np.ndarray | None, object, dict]:
    params = dict(request)
    logits = np.array(params.pop("logits"), dtype=np.float64)
    mask = params.pop("mask", None)
    prev = params.pop("previous_tokens", None)
    return logits, None if mask is None else np.array(mask), prev, params


CASES = golden.load("sample")


@pytest.mark.parametrize("case", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_golden_float64(case) -> None:
    logits, mask, prev, params = split(case["request"])
    got = final(logits, mask, prev, **params)
    np.testing.assert_allclose(got, case["probabilities"], rtol=0, atol=1e-12)
    assert np.all(got[np.array(case["probabilities"]) == 0] == 0)


@pytest.mark.parametrize("case", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_golden_float32(case) -> None:
    logits, mask, prev, params = split(case["request"])
    got = final(logits.astype(np.float32), mask, prev, dtype=np.float32, **params)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, case["probabilities"], rtol=0, atol=2e-6)


@pytest.mark.parametrize(
    ("params", "previous", "expected"),
    [
        ({"top_k": 2}, None, [0.2891, 0, 0, 0.7109]),
        ({"top_p": 0.6}, None, [0, 0, 0, 1]),
        ({"temperature": 2, "top_p": 0.9}, None, [0.3314, 0.1489, 0, 0.5197]),
        (
            {"repetition_penalty": 1.5, "frequency_penalty": 0.1, "presence_penalty": 0.2},
            [0, 2, 2],
            [0.1209, 0.0663, 0.0045, 0.8083],
        ),
    ],
)
def test_reference_numbers(params, previous, expected) -> None:
    np.testing.assert_allclose(final(ROW2, previous_tokens=previous, **params), expected, atol=5e-5)


def test_diagnostics_of_the_reference_row() -> None:
    filtered, _ = S.process(ROW2, S.SamplingParams(top_k=2))
    p = normalizers.softmax(ROW2)
    assert filtered.kept.tolist() == [2]
    np.testing.assert_allclose(filtered.removed_mass, [p[1] + p[2]], rtol=1e-12)
    q = np.array([p[0], p[3]]) / (p[0] + p[3])
    np.testing.assert_allclose(filtered.entropy, [-(q * np.log(q)).sum()], rtol=1e-12)
    raw = S.raw_stats(ROW2[None])
    np.testing.assert_allclose(raw.entropy, [0.8296], atol=1e-4)  # docs/concepts/contract.md: row 2's softmax entropy


# --------------------------------------------------------------------------- a plain reference, row by row


def reference(z: np.ndarray, params: S.SamplingParams) -> np.ndarray:
    """Steps 4-8 for one row of step 3's values with a full sort per row (docs/concepts/contract.md, literally)."""
    out = np.zeros_like(z)
    if params.temperature == 0:
        out[int(np.argmax(z))] = 1
        return out
    y = z / params.temperature
    keep = np.isfinite(y)
    if 0 < params.top_k < len(y):
        kth = sorted(y, reverse=True)[params.top_k - 1]
        keep &= y >= kth
    if params.top_p < 1:
        p = np.where(keep, np.exp(y - y[keep].max()), 0)
        p /= p.sum()
        order = sorted(range(len(y)), key=lambda j: (-p[j], j))
        mass = 0.0
        cut = np.zeros_like(keep)
        for j in order:
            if mass < params.top_p and keep[j]:
                cut[j] = True
            mass += p[j]
        keep = cut
    if params.min_p > 0:
        p = np.where(keep, np.exp(y - y[keep].max()), 0)
        keep &= p >= params.min_p * p.max()
    e = np.where(keep, np.exp(y - y[keep].max()), 0)
    return e / e.sum()


logit_rows = st.integers(2, 40).flatmap(
    lambda v: st.lists(
        st.lists(st.floats(-8, 8, allow_nan=False).map(lambda x: round(x, 1)), min_size=v, max_size=v),
        min_size=1,
        max_size=4,
    )
)
options = st.fixed_dictionaries(
    {
        "temperature": st.sampled_from([0.0, 0.3, 1.0, 2.5]),
        "top_k": st.integers(0, 45),
        "top_p": st.sampled_from([1.0, 0.95, 0.7, 0.3, 0.01]),
        "min_p": st.sampled_from([0.0, 0.05, 0.5, 0.99]),
    }
)


@settings(max_examples=150, deadline=None)
@given(rows=logit_rows, opts=options)
def test_matches_a_row_by_row_reference(rows, opts) -> None:
    """Rounded logits make ties common, so the tie rules of top_k and top_p are exercised too."""
    z = np.array(rows, dtype=np.float64)
    params = S.SamplingParams(**opts)
    got = final(z, **opts)
    want = np.stack([reference(r, params) for r in z])
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
    assert np.array_equal(got == 0, want == 0)  # removed tokens are exactly 0, kept ones are not
    assert np.all((got > 0).sum(axis=1) >= 1)
    np.testing.assert_allclose(got.sum(axis=1), 1, rtol=1e-12)


@settings(max_examples=60, deadline=None)
@given(rows=logit_rows, dtype=st.sampled_from([np.float32, np.float64]))
def test_defaults_leave_the_softmax_unchanged(rows, dtype) -> None:
    z = np.array(rows, dtype=dtype)
    want = normalizers.softmax(z)
    for params in ({}, {"top_p": 1.0, "top_k": 0, "min_p": 0.0, "temperature": 1.0}, {"top_k": z.shape[1]}):
        got = final(z, dtype=dtype, **params)
        np.testing.assert_allclose(got, want, rtol=1e-6 if dtype == np.float32 else 1e-13, atol=0)
    filtered, _ = S.process(z, S.SamplingParams())
    assert np.all(filtered.removed_mass == 0)


@pytest.mark.parametrize("vocab", [300, 5000, 70000])
@pytest.mark.parametrize(
    "opts",
    [
        {"top_p": 0.9},
        {"top_p": 0.999},
        {"top_p": 0.5, "min_p": 0.001},
        {"top_k": 50, "top_p": 0.9},
        {"top_k": 40},
        {"min_p": 0.02},
        {"temperature": 0.7, "top_k": 500, "top_p": 0.95, "min_p": 0.01},
    ],
    ids=str,
)
def test_partial_selection_matches_a_full_sort(vocab: int, opts) -> None:
    """Large vocabularies, quantized so that ties straddle candidate boundaries; top_p alone grows its candidates."""
    rng = np.random.default_rng(vocab)
    z = np.round(rng.standard_normal((3, vocab)) * 2, 1)
    z[1] = np.round(rng.standard_normal(vocab) * 0.2, 2)  # a flat row: top_p needs thousands of tokens
    params = S.SamplingParams(**opts)
    got = final(z, **opts)
    want = np.stack([reference(r, params) for r in z])
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
    assert np.array_equal(got > 0, want > 0)


def test_all_equal_logits_keep_the_lowest_ids_under_top_p() -> None:
    z = np.zeros((2, 1000))
    got = final(z, top_p=0.0105)  # mass before token j is j/1000: tokens 0..10 are kept
    assert np.nonzero(got[0])[0].tolist() == list(range(11))
    np.testing.assert_allclose(got[:, :11], 1 / 11)


# --------------------------------------------------------------------------- greedy and masks


def test_greedy_is_the_argmax_with_ties_to_the_lowest_id() -> None:
    z = np.array([[1.0, 3.0, 3.0, 2.0], [5.0, -1.0, 5.0, 5.0], [-2.0, -3.0, -1.0, -1.0]])
    filtered, _ = S.process(z, S.SamplingParams(temperature=0, top_k=1, top_p=0.1))
    tokens, logp = S.draw(filtered, S.uniforms(0, (3, 50)))
    assert tokens[:, 0].tolist() == [1, 0, 2] and np.all(tokens == tokens[:, :1])
    assert np.all(logp == 0)
    np.testing.assert_array_equal(filtered.dense(np.float64), np.eye(4)[[1, 0, 2]])
    assert filtered.kept.tolist() == [1, 1, 1] and np.all(filtered.entropy == 0)


def test_greedy_uses_the_penalized_and_masked_values() -> None:
    z = np.array([3.0, 2.9, 1.0, 0.0])
    assert np.argmax(final(z, temperature=0)) == 0
    assert np.argmax(final(z, temperature=0, previous_tokens=[0], presence_penalty=0.5)) == 1
    assert np.argmax(final(z, temperature=0, mask=[False, False, True, True])) == 2


def test_masks_select_or_add() -> None:
    z = np.array([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]])
    got = final(z, mask=np.array([True, False, True]))
    assert got[0, 1] == 0 and got[1, 1] == 0
    np.testing.assert_allclose(got[1], [0.5, 0, 0.5])
    added = final(z, mask=np.array([0.0, -math.inf, 1.0]))
    np.testing.assert_allclose(
        added[0], [*normalizers.softmax(np.array([1.0, 4.0]))[:1], 0, np.exp(4) / (np.e + np.exp(4))]
    )
    np.testing.assert_allclose(added[1], [1 / (1 + np.e), 0, np.e / (1 + np.e)])
    with pytest.raises(InvalidInput) as err:
        final(z, mask=np.array([[True, True, True], [False, False, False]]))
    assert err.value.loc == ("mask", 1)
    with pytest.raises(InvalidInput) as err:
        final(z, mask=np.ones((3, 3), dtype=bool))
    assert err.value.loc == ("mask", "shape")


def test_extreme_logits_give_finite_diagnostics() -> None:
    """Logits across the whole float range: the shift by the max overflows to -inf, never to NaN."""
    for dtype, big in ((np.float32, 3e38), (np.float64, 1.7e308)):
        z = np.array([[big, -big, 0.0]], dtype=dtype)
        raw = S.raw_stats(z)
        assert np.isfinite(raw.entropy).all() and raw.entropy[0] == 0 and raw.lse[0] == 0
        filtered, _ = S.process(z, S.SamplingParams(temperature=0.5, top_p=0.5), raw=raw)
        assert filtered.kept.tolist() == [1] and np.isfinite(filtered.removed_mass).all()


def test_tiny_temperatures_do_not_overflow() -> None:
    z = np.array([3e38, 2.9e38, -3e38], dtype=np.float32)
    for t in (1e-30, 1e-300):
        got = final(z, dtype=np.float32, temperature=t)
        np.testing.assert_array_equal(got, [1, 0, 0])


# --------------------------------------------------------------------------- penalties


def test_penalties_per_row_shared_and_padded() -> None:
    z = np.tile(ROW2, (2, 1))
    opts = {"repetition_penalty": 1.5, "frequency_penalty": 0.1, "presence_penalty": 0.2}
    want_row = [0.1209, 0.0663, 0.0045, 0.8083]
    per_row = final(z, previous_tokens=[[0, 2, 2], []], **opts)
    np.testing.assert_allclose(per_row[0], want_row, atol=5e-5)
    np.testing.assert_allclose(per_row[1], normalizers.softmax(ROW2), atol=1e-12)
    shared = final(z, previous_tokens=[0, 2, 2], **opts)
    np.testing.assert_allclose(shared, [want_row, want_row], atol=5e-5)
    padded = final(z, previous_tokens=np.array([[0, 2, 2], [-1, -1, -1]]), **opts)
    np.testing.assert_allclose(padded, per_row, atol=0)


def test_repetition_penalty_follows_the_ctrl_rule() -> None:
    z = np.array([2.0, -2.0, 1.0, 0.0])
    _, penalized = S.process(z, S.SamplingParams(repetition_penalty=2.0), previous_tokens=[0, 0, 1, 3])
    np.testing.assert_array_equal(penalized[0], [1.0, -4.0, 1.0, 0.0])  # once per distinct token; 0 stays 0


@pytest.mark.parametrize(
    ("previous", "loc"),
    [([0, 4], ("previous_tokens", 1)), ([[1], [0, -2]], ("previous_tokens", 1, 1)), ([[1]], ("previous_tokens",))],
)
def test_bad_previous_tokens(previous, loc) -> None:
    with pytest.raises(InvalidInput) as err:
        final(np.zeros((2, 4)), previous_tokens=previous, presence_penalty=1.0)
    assert err.value.loc == loc


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", -1.0),
        ("temperature", math.inf),
        ("top_k", -1),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("min_p", 1.0),
        ("min_p", -0.1),
        ("repetition_penalty", 0.0),
        ("presence_penalty", math.nan),
        ("frequency_penalty", math.inf),
    ],
)
def test_bad_options_name_the_field(field: str, value) -> None:
    with pytest.raises(InvalidInput) as err:
        final(ROW2, **{field: value})
    assert err.value.loc == (field,)


# --------------------------------------------------------------------------- drawing


def test_uniforms_are_philox_words_and_pinned() -> None:
    """The stream is fixed by numpy's Philox and SeedSequence: pinned so that a change cannot go unnoticed."""
    u = S.uniforms(2024, (2, 3))
    words = np.random.Philox(2024).random_raw(6)
    np.testing.assert_array_equal(u.reshape(-1), (words >> np.uint64(11)) * 2.0**-53)
    assert np.all((u >= 0) & (u < 1))
    assert u.reshape(-1)[:3].round(12).tolist() == PINNED_UNIFORMS


PINNED_UNIFORMS = [0.270612937565, 0.618983515082, 0.038714373391]


def test_seeded_draws_are_reproducible() -> None:
    z = np.random.default_rng(1).standard_normal((5, 1000)).astype(np.float32)
    filtered, _ = S.process(z, S.SamplingParams(temperature=0.8, top_p=0.95))
    a = S.draw(filtered, S.uniforms(42, (5, 16)))[0]
    b = S.draw(filtered, S.uniforms(42, (5, 16)))[0]
    c = S.draw(filtered, S.uniforms(43, (5, 16)))[0]
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert a.tolist()[0][:8] == PINNED_TOKENS


PINNED_TOKENS = [112, 175, 301, 874, 191, 537, 376, 860]


def chi_square(counts: np.ndarray, probs: np.ndarray) -> float:
    expected = probs * counts.sum()
    return float(np.sum((counts - expected) ** 2 / expected))


# Upper 0.1% points of the chi-square distribution (Abramowitz & Stegun, table 26.8).
CHI2_999 = {2: 13.816, 9: 27.877, 19: 43.820}


@pytest.mark.parametrize(
    ("logits", "opts", "dof"),
    [
        (ROW2, {"temperature": 2.0, "top_p": 0.9}, 2),
        (np.linspace(-2, 2, 10), {}, 9),
        (np.random.default_rng(5).standard_normal(300) * 3, {"top_k": 20}, 19),
    ],
    ids=["reference-row", "plain-softmax", "top-k-20"],
)
def test_twenty_thousand_draws_follow_the_final_distribution(logits, opts, dof: int) -> None:
    """Chi-square goodness of fit at the 0.1% level; a fixed seed makes the outcome fixed, not flaky."""
    filtered, _ = S.process(np.asarray(logits), S.SamplingParams(**opts))
    p = filtered.dense(np.float64)[0]
    tokens, logp = S.draw(filtered, S.uniforms(12345, (1, 20000)))
    counts = np.bincount(tokens[0], minlength=p.size)
    assert np.all(counts[p == 0] == 0)  # removed tokens are never drawn
    kept = p > 0
    assert kept.sum() == dof + 1
    assert chi_square(counts[kept], p[kept]) < CHI2_999[dof]
    np.testing.assert_allclose(logp[0], np.log(p[tokens[0]]), rtol=1e-12)


def test_draws_from_many_rows_at_once_match_one_row_at_a_time() -> None:
    z = np.random.default_rng(3).standard_normal((6, 500))
    filtered, _ = S.process(z, S.SamplingParams(top_p=0.8))
    u = S.uniforms(9, (6, 7))
    tokens, _ = S.draw(filtered, u)
    for i in range(6):
        p = filtered.dense(np.float64)[i]
        cdf = np.cumsum(p)
        want = [int(np.searchsorted(cdf, x * cdf[-1], side="right")) for x in u[i]]
        assert tokens[i].tolist() == want


def test_top_logprobs_are_sorted_and_stop_at_the_kept_tokens() -> None:
    filtered, _ = S.process(np.array([[1.0, 3.0, 3.0, 2.0, -5.0]]), S.SamplingParams(top_k=3))
    ids, logp, valid = S.top_logprobs(filtered, 5)
    assert ids[0][valid[0]].tolist() == [1, 2, 3]
    np.testing.assert_allclose(np.exp(logp[0][valid[0]]).sum(), 1)
    plain, _ = S.process(np.array([[1.0, 3.0, 3.0, 2.0, -5.0]]), S.SamplingParams())
    ids, _, valid = S.top_logprobs(plain, 2)
    assert ids[0].tolist() == [1, 2] and valid.all()


def test_rows_with_different_kept_counts_are_padded_and_the_padding_is_never_used() -> None:
    z = np.array([[1.0, 2.0, 2.0, 2.0, 0.0], [5.0, 4.0, 3.0, 2.0, 1.0]])
    filtered, _ = S.process(z, S.SamplingParams(top_k=2))
    assert filtered.ids.shape == (2, 3) and filtered.ids[1, 2] == -1 and filtered.probs[1, 2] == 0
    np.testing.assert_allclose(
        filtered.dense(np.float64), [[0, 1 / 3, 1 / 3, 1 / 3, 0], [*normalizers.softmax(np.array([5.0, 4.0])), 0, 0, 0]]
    )
    tokens, _ = S.draw(filtered, S.uniforms(0, (2, 2000)))
    assert set(tokens[0].tolist()) == {1, 2, 3} and set(tokens[1].tolist()) == {0, 1}
    ids, _, valid = S.top_logprobs(filtered, 3)
    assert ids[0].tolist() == [1, 2, 3] and valid[1].tolist() == [True, True, False]
    plain, _ = S.process(z, S.SamplingParams())
    ids, _, valid = S.top_logprobs(plain, 2)
    assert ids.tolist() == [[1, 2], [0, 1]] and valid.all()


@settings(max_examples=200, deadline=None)
@given(
    rows=st.integers(1, 3).flatmap(
        lambda n: st.lists(
            st.lists(
                st.floats(-3.0000000054977558e38, 3.0000000054977558e38, allow_nan=False, width=32),
                min_size=4,
                max_size=4,
            ),
            min_size=n,
            max_size=n,
        )
    ),
    temperature=st.one_of(st.just(0.0), st.floats(1e-300, 1e300)),
    top_k=st.integers(0, 6),
    top_p=st.floats(1e-9, 1.0, exclude_min=False),
    min_p=st.floats(0.0, 0.999),
    penalty=st.floats(-1e300, 1e300),
    dtype=st.sampled_from([np.float32, np.float64]),
)
def test_any_finite_input_gives_a_distribution_or_a_clear_refusal(
    rows, temperature, top_k, top_p, min_p, penalty, dtype
) -> None:
    """Over the whole float range: a proper distribution (no NaN, sums to 1) or an InvalidInput, nothing else."""
    z = np.array(rows, dtype=dtype)
    params = S.SamplingParams(temperature, top_k, top_p, min_p, 1.3, penalty, penalty)
    try:
        raw = S.raw_stats(z)
        filtered, _ = S.process(z, params, previous_tokens=[0, 0, 3], raw=raw)
    except InvalidInput as exc:
        assert exc.loc[0] in ("frequency_penalty", "mask")
        return
    p = filtered.dense(np.float64)
    assert np.isfinite(p).all() and np.all(p >= 0)
    np.testing.assert_allclose(p.sum(axis=1), 1, rtol=1e-5)
    assert np.isfinite(raw.entropy).all() and np.isfinite(filtered.entropy).all()
    assert np.isfinite(filtered.removed_mass).all() and np.all(filtered.kept >= 1)
    tokens, logp = S.draw(filtered, S.uniforms(1, (z.shape[0], 3)))
    assert np.all(np.take_along_axis(p, tokens, 1) > 0) and np.isfinite(logp).all()
