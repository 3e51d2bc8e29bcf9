"""The attention core against the golden cases, hand-built references and its own properties."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.core.attention import attention, check_dims, run_attention
from service.core.backward import BackwardTask, run_backward
from service.core.errors import InvalidInput, NumericalError
from service.core.types import AttentionInputs, AttentionParams, AttentionTask
from tests.golden import load, task_from_request, tolerance

NORMALIZERS = [("softmax", None), ("sparsemax", None), ("entmax15", None), ("entmax", 1.3), ("relu", None)]


@pytest.mark.parametrize("case", load("attention"), ids=lambda c: f"{c['request']['normalizer']}")
def test_golden_forward(case: dict) -> None:
    task = task_from_request(case["request"])
    result = run_attention(task)
    tol = tolerance(case["request"])
    np.testing.assert_allclose(result.output, np.array(case["expected"]["output"]), atol=tol, rtol=0)
    np.testing.assert_allclose(result.weights, np.array(case["expected"]["weights"]), atol=tol, rtol=0)


@pytest.mark.parametrize("case", load("backward"), ids=lambda c: f"{c['request']['normalizer']}")
def test_golden_backward(case: dict) -> None:
    task = task_from_request(case["request"])
    grads = run_backward(BackwardTask(task, np.array(case["request"]["grad_output"])))
    tol = tolerance(case["request"])
    for name in ("grad_query", "grad_key", "grad_value"):
        np.testing.assert_allclose(
            getattr(grads, name), np.array(case["expected"][name]), atol=tol, rtol=0, err_msg=name
        )


def naive(q, k, v, *, keep=None, bias=None, scale=None, temperature=1.0, normalizer="softmax", alpha=None):
    """Direct transcription of the contract's forward pass on rank-4 float64 arrays, one row at a time."""
    from service.core import normalizers

    B, Hq, L, E = q.shape
    Hkv = k.shape[1]
    G = Hq // Hkv
    scale = 1 / math.sqrt(E) if scale is None else scale
    out = np.zeros((B, Hq, L, v.shape[-1]))
    w = np.zeros((B, Hq, L, k.shape[2]))
    for b in range(B):
        for h in range(Hq):
            s = scale * q[b, h] @ k[b, h // G].T
            if bias is not None:
                s = s + np.broadcast_to(bias, (B, Hq) + s.shape)[b, h]
            if keep is not None:
                s = np.where(np.broadcast_to(keep, (B, Hq) + s.shape)[b, h], s, -np.inf)
            s = s / temperature
            a = normalizers.normalize(s, normalizer, alpha=alpha)
            w[b, h] = a
            out[b, h] = a @ v[b, h // G]
    return out, w


def rand(rng: np.random.Generator, *shape: int, scale: float = 1.0) -> np.ndarray:
    return rng.standard_normal(shape) * scale


@pytest.mark.parametrize("normalizer,alpha", NORMALIZERS)
@pytest.mark.parametrize("alignment", ["top_left", "bottom_right"])
@pytest.mark.parametrize("L,S", [(3, 7), (7, 3), (1, 5), (4, 4)])
def test_causal_alignments_match_explicit_masks(
    normalizer: str, alpha: float | None, alignment: str, L: int, S: int
) -> None:
    rng = np.random.default_rng(L * 10 + S)
    q, k, v = rand(rng, 2, 4, L, 8), rand(rng, 2, 2, S, 8), rand(rng, 2, 2, S, 5)
    i, j = np.arange(L)[:, None], np.arange(S)[None, :]
    keep = j <= i if alignment == "top_left" else j <= i + (S - L)
    params = AttentionParams(normalizer=normalizer, alpha=alpha, causal=alignment)
    got = attention(q, k, v, params=params, dtype=np.float64)
    want_out, want_w = naive(q, k, v, keep=keep, normalizer=normalizer, alpha=alpha)
    np.testing.assert_allclose(got.weights, want_w, atol=1e-10)
    np.testing.assert_allclose(got.output, want_out, atol=1e-10)
    live = keep.any(axis=1)
    assert (got.valid_keys[0, 0] == keep.sum(axis=1)).all()
    # rows that see no key (top_left with L > S never; bottom_right with L > S does) are exactly zero
    assert not np.any(got.weights[:, :, ~live]) and not np.any(got.output[:, :, ~live])


def test_fully_masked_rows_are_zero_and_counted() -> None:
    rng = np.random.default_rng(0)
    q, k, v = rand(rng, 1, 2, 3, 4), rand(rng, 1, 2, 5, 4), rand(rng, 1, 2, 5, 4)
    keep = np.ones((1, 2, 3, 5), dtype=bool)
    keep[0, 1, 2] = False
    for normalizer, alpha in NORMALIZERS:
        with np.errstate(all="raise"):
            r = attention(
                q, k, v, mask=keep, params=AttentionParams(normalizer=normalizer, alpha=alpha), dtype=np.float64
            )
        assert np.all(r.weights[0, 1, 2] == 0) and np.all(r.output[0, 1, 2] == 0)
        assert np.isfinite(r.output).all()
        assert r.valid_keys[0, 1, 2] == 0 and r.valid_keys[0, 0, 0] == 5


def test_key_lengths_equal_truncating_keys() -> None:
    rng = np.random.default_rng(1)
    q, k, v = rand(rng, 2, 2, 3, 4), rand(rng, 2, 2, 6, 4), rand(rng, 2, 2, 6, 3)
    r = attention(q, k, v, key_lengths=np.array([6, 2]), dtype=np.float64)
    for b, n in enumerate([6, 2]):
        ref = attention(q[b : b + 1], k[b : b + 1, :, :n], v[b : b + 1, :, :n], dtype=np.float64)
        np.testing.assert_allclose(r.output[b : b + 1], ref.output, atol=1e-12)
        np.testing.assert_allclose(r.weights[b : b + 1, ..., :n], ref.weights, atol=1e-12)
        assert np.all(r.weights[b, ..., n:] == 0)
    zero = attention(q, k, v, key_lengths=np.array([0, 3]), dtype=np.float64)
    assert np.all(zero.output[0] == 0) and zero.valid_keys[0].max() == 0


def test_gqa_equals_repeat_interleave() -> None:
    rng = np.random.default_rng(2)
    q, k, v = rand(rng, 2, 6, 4, 8), rand(rng, 2, 2, 5, 8), rand(rng, 2, 2, 5, 3)
    r = attention(q, k, v, dtype=np.float64)
    full = attention(q, np.repeat(k, 3, axis=1), np.repeat(v, 3, axis=1), dtype=np.float64)
    np.testing.assert_allclose(r.output, full.output, atol=1e-12)
    np.testing.assert_allclose(r.weights, full.weights, atol=1e-12)


@pytest.mark.parametrize("rank", [2, 3, 4])
def test_ranks_keep_the_query_rank(rank: int) -> None:
    rng = np.random.default_rng(rank)
    q4, k4, v4 = rand(rng, 1, 1, 3, 4), rand(rng, 1, 1, 5, 4), rand(rng, 1, 1, 5, 2)
    cut = 4 - rank
    r = attention(q4.reshape(q4.shape[cut:]), k4.reshape(k4.shape[cut:]), v4.reshape(v4.shape[cut:]), dtype=np.float64)
    ref = attention(q4, k4, v4, dtype=np.float64)
    assert r.output.shape == q4.shape[cut:-1] + (2,) and r.weights.shape == q4.shape[cut:-1] + (5,)
    np.testing.assert_allclose(r.output.reshape(ref.output.shape), ref.output)


def test_float_mask_bias_and_temperature_follow_the_pipeline() -> None:
    rng = np.random.default_rng(3)
    q, k, v = rand(rng, 1, 2, 3, 4), rand(rng, 1, 2, 5, 4), rand(rng, 1, 2, 5, 4)
    bias = rand(rng, 3, 5)
    bias[1, 2] = -np.inf
    r = attention(
        q, k, v, mask=bias, params=AttentionParams(temperature=0.7, scale=0.3), dtype=np.float64, need_scores=True
    )
    want_out, want_w = naive(q, k, v, bias=bias, scale=0.3, temperature=0.7)
    np.testing.assert_allclose(r.weights, want_w, atol=1e-12)
    np.testing.assert_allclose(r.output, want_out, atol=1e-12)
    assert r.weights[0, 0, 1, 2] == 0 and np.isneginf(r.scores[0, 0, 1, 2])
    np.testing.assert_allclose(r.scores[0, 0, 0], (0.3 * q[0, 0, 0] @ k[0, 0].T + bias[0]) / 0.7, atol=1e-12)
    assert r.valid_keys[0, 0].tolist() == [5, 4, 5]


def test_large_scores_in_float32_are_finite_and_correct() -> None:
    q = np.array([[1.0, 0.0]], dtype=np.float32)
    k = np.array([[1e4, 0.0], [-1e4, 0.0], [1e4 - 1, 0.0]], dtype=np.float32)
    v = np.eye(3, dtype=np.float32)
    for normalizer, alpha in NORMALIZERS:
        r = attention(q, k, v, params=AttentionParams(normalizer=normalizer, alpha=alpha, scale=1.0), dtype=np.float32)
        assert np.isfinite(r.weights).all() and np.isfinite(r.output).all()
        assert r.weights[0, 1] == 0
        np.testing.assert_allclose(r.weights.sum(), 1.0, atol=1e-6)
    soft = attention(q, k, v, params=AttentionParams(scale=1.0), dtype=np.float32)
    np.testing.assert_allclose(
        soft.weights[0], [1 / (1 + math.exp(-1)), 0, math.exp(-1) / (1 + math.exp(-1))], atol=1e-6
    )


# (scale, temperature) whose quotient float32 cannot hold as a normal number: a subnormal and an underflow
TINY_FACTORS = [(1e-40, 1.0), (1e-25, 1e24)]


def tiny_factor_inputs(factor: float, seed: int = 4) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Float32 queries and keys of about ``factor ** -0.5`` each, so ``factor * q.k`` is of order 1."""
    rng = np.random.default_rng(seed)
    big = factor**-0.5
    q, k = rng.standard_normal((2, 3, 4)) * big, rng.standard_normal((2, 5, 4)) * big
    v, g = rng.standard_normal((2, 5, 3)), rng.standard_normal((2, 3, 3))
    return tuple(x.astype(np.float32) for x in (q, k, v, g))  # type: ignore[return-value]


@pytest.mark.parametrize(("scale", "temperature"), TINY_FACTORS)
@pytest.mark.parametrize(("normalizer", "alpha"), NORMALIZERS)
def test_float32_scale_over_temperature_below_the_normal_range(
    scale: float, temperature: float, normalizer: str, alpha: float | None
) -> None:
    """A scale / T under 1.2e-38 with queries and keys large enough for scores of order 1: float32 answers
    are float64's to float32 precision (the factor was rounded to 0 or a subnormal: uniform weights).
    """
    q, k, v, g = tiny_factor_inputs(scale / temperature)
    params = AttentionParams(normalizer=normalizer, alpha=alpha, scale=scale, temperature=temperature)
    got = attention(q, k, v, params=params, dtype=np.float32, need_scores=True)
    want = attention(q, k, v, params=params, dtype=np.float64, need_scores=True)
    assert np.abs(want.scores).max() > 0.5 and np.ptp(want.weights, axis=-1).min() > 1e-2  # far from uniform
    for name in ("scores", "weights", "output"):
        np.testing.assert_allclose(getattr(got, name), getattr(want, name), rtol=1e-5, atol=1e-6, err_msg=name)
    if normalizer == "relu":
        return
    got_b, want_b = (
        run_backward(BackwardTask(AttentionTask(AttentionInputs(q, k, v), params, np.dtype(dtype)), g))
        for dtype in (np.float32, np.float64)
    )
    for name in ("grad_query", "grad_key", "grad_value"):
        a, b = getattr(got_b, name), getattr(want_b, name)
        assert np.abs(b).max() > 0, name
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5 * np.abs(b).max(), err_msg=name)


def test_float32_overflow_is_an_error_not_nan() -> None:
    q = np.full((2, 4), 1e20, dtype=np.float32)
    with pytest.raises(NumericalError, match="float64"):
        attention(q, q, q, dtype=np.float32)
    r = attention(q, q, q, dtype=np.float64)
    assert np.isfinite(r.output).all()


@pytest.mark.parametrize(
    "q,k,v,message",
    [
        ((2, 4, 64), (2, 4, 32), (2, 4, 8), "key has E=32 but query has E=64"),
        ((3, 4, 8), (2, 4, 8), (2, 4, 8), "not a multiple"),
        ((2, 4, 8), (2, 5, 8), (2, 6, 8), "value has S=6 but key has S=5"),
        ((1, 2, 4, 8), (2, 2, 4, 8), (2, 2, 4, 8), "key has B=2 but query has B=1"),
        ((4, 8), (1, 4, 8), (1, 4, 8), "same rank"),
    ],
)
def test_shape_errors_name_field_and_dimension(q, k, v, message) -> None:
    with pytest.raises(InvalidInput, match=message):
        check_dims(q, k, v)


def test_invalid_params_are_rejected() -> None:
    x = np.ones((2, 2))
    for params, field in [
        (AttentionParams(normalizer="entmax", alpha=1.0), "alpha"),
        (AttentionParams(normalizer="entmax"), "alpha"),
        (AttentionParams(temperature=0.0), "temperature"),
        (AttentionParams(scale=-1.0), "scale"),
        (AttentionParams(normalizer="gumbel"), "normalizer"),
    ]:
        with pytest.raises(InvalidInput) as info:
            attention(x, x, x, params=params)
        assert info.value.loc == (field,)


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 4),
    st.integers(2, 6),
    st.sampled_from(NORMALIZERS),
    st.integers(0, 2**31 - 1),
)
def test_masking_a_key_equals_removing_it(L: int, S: int, norm: tuple, seed: int) -> None:
    rng = np.random.default_rng(seed)
    q, k, v = rand(rng, 1, 1, L, 4), rand(rng, 1, 1, S, 4), rand(rng, 1, 1, S, 3)
    drop = int(rng.integers(S))
    params = AttentionParams(normalizer=norm[0], alpha=norm[1], scale=0.5)
    keep = np.ones(S, dtype=bool)
    keep[drop] = False
    bias = np.zeros(S)
    bias[drop] = -np.inf
    kept = np.delete(np.arange(S), drop)
    ref = attention(q, k[:, :, kept], v[:, :, kept], params=params, dtype=np.float64)
    for mask in (keep, bias):
        r = attention(q, k, v, mask=mask, params=params, dtype=np.float64)
        np.testing.assert_allclose(r.output, ref.output, atol=1e-9)
        np.testing.assert_allclose(r.weights[..., kept], ref.weights, atol=1e-9)
        assert np.all(r.weights[..., drop] == 0)


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 7), st.sampled_from(NORMALIZERS), st.integers(0, 2**31 - 1))
def test_permuting_keys_and_values_together_leaves_output_unchanged(S: int, norm: tuple, seed: int) -> None:
    rng = np.random.default_rng(seed)
    q, k, v = rand(rng, 2, 3, 4), rand(rng, 2, S, 4), rand(rng, 2, S, 5)
    perm = rng.permutation(S)
    params = AttentionParams(normalizer=norm[0], alpha=norm[1])
    a = attention(q, k, v, params=params, dtype=np.float64)
    b = attention(q, k[:, perm], v[:, perm], params=params, dtype=np.float64)
    np.testing.assert_allclose(a.output, b.output, atol=1e-9)
    np.testing.assert_allclose(a.weights[..., perm], b.weights, atol=1e-9)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(NORMALIZERS), st.sampled_from([None, "top_left", "bottom_right"]), st.integers(0, 2**31 - 1))
def test_rows_are_distributions(norm: tuple, causal: str | None, seed: int) -> None:
    rng = np.random.default_rng(seed)
    q, k, v = rand(rng, 2, 4, 3, 4, scale=2), rand(rng, 2, 2, 5, 4, scale=2), rand(rng, 2, 2, 5, 2)
    r = attention(q, k, v, params=AttentionParams(normalizer=norm[0], alpha=norm[1], causal=causal), dtype=np.float64)
    assert (r.weights >= 0).all()
    sums = r.weights.sum(-1)
    live = sums > 0
    np.testing.assert_allclose(sums[live], 1.0, atol=1e-9)
    if norm[0] != "relu":  # relu rows with no positive score are zeros by contract
        assert live[r.valid_keys > 0].all()


@pytest.mark.parametrize("normalizer,alpha", NORMALIZERS)
@pytest.mark.parametrize("causal", [None, "bottom_right"])
def test_backward_matches_finite_differences(normalizer: str, alpha: float | None, causal: str | None) -> None:
    rng = np.random.default_rng(7)
    q, k, v = rand(rng, 1, 2, 3, 4), rand(rng, 1, 1, 4, 4), rand(rng, 1, 1, 4, 3)
    g = rand(rng, 1, 2, 3, 3)
    params = AttentionParams(normalizer=normalizer, alpha=alpha, temperature=0.8, causal=causal)

    def loss(q_, k_, v_):
        return float((attention(q_, k_, v_, params=params, dtype=np.float64).output * g).sum())

    task = AttentionTask(AttentionInputs(q, k, v), params, np.dtype(np.float64))
    grads = run_backward(BackwardTask(task, g))
    eps = 1e-6
    for name, x, analytic in (("q", q, grads.grad_query), ("k", k, grads.grad_key), ("v", v, grads.grad_value)):
        numeric = np.zeros_like(x)
        for idx in np.ndindex(x.shape):
            xp, xm = x.copy(), x.copy()
            xp[idx] += eps
            xm[idx] -= eps
            args_p = {"q": (xp, k, v), "k": (q, xp, v), "v": (q, k, xp)}[name]
            args_m = {"q": (xm, k, v), "k": (q, xm, v), "v": (q, k, xm)}[name]
            numeric[idx] = (loss(*args_p) - loss(*args_m)) / (2 * eps)
        np.testing.assert_allclose(analytic, numeric, atol=1e-5, err_msg=f"d{name} for {normalizer}")


@pytest.mark.parametrize("budget", [1, 5, 40, 200, 1000, 1 << 18])
@pytest.mark.parametrize("threads", [None, 2])
def test_chunking_and_threads_do_not_change_results(monkeypatch, budget: int, threads: int | None) -> None:
    """Chunks of rows, of query heads and of kv heads (with every mask kind) give the same numbers."""
    from concurrent.futures import ThreadPoolExecutor

    from service.core.attention import chunks, forward

    monkeypatch.setattr(chunks, "CHUNK_ELEMENTS", budget)
    monkeypatch.setattr(chunks, "MIN_CHUNK_ELEMENTS", 1)
    monkeypatch.setattr(chunks, "PARALLEL_MIN_ELEMENTS", 1)
    monkeypatch.setattr(forward, "FAST_PATH_SCORES", 0)  # these tasks are small: chunk them all the same
    rng = np.random.default_rng(budget)
    q, k, v = rand(rng, 2, 6, 5, 4), rand(rng, 2, 2, 7, 4), rand(rng, 2, 2, 7, 3)
    keep = rng.random((2, 6, 5, 7)) > 0.3
    bias = rand(rng, 1, 6, 1, 7)
    executor = ThreadPoolExecutor(threads) if threads else None
    try:
        for normalizer, alpha in NORMALIZERS:
            for mask, causal, key_lengths in (
                (keep, "bottom_right", None),
                (bias, "top_left", np.array([7, 3])),
                (None, None, None),
            ):
                params = AttentionParams(normalizer=normalizer, alpha=alpha, causal=causal)
                task = AttentionTask(
                    AttentionInputs(q, k, v, mask, key_lengths), params, np.dtype(np.float64), True, True
                )
                got = run_attention(task, executor=executor, workers=threads or 1)
                monkeypatch.setattr(chunks, "CHUNK_ELEMENTS", 1 << 30)
                want = run_attention(task)
                monkeypatch.setattr(chunks, "CHUNK_ELEMENTS", budget)
                np.testing.assert_allclose(got.output, want.output, atol=1e-12)
                np.testing.assert_allclose(got.weights, want.weights, atol=1e-12)
                np.testing.assert_allclose(
                    got.scores, want.scores, atol=1e-12
                )  # BLAS may pick other kernels per chunk size
                out_only = run_attention(
                    AttentionTask(task.inputs, params, task.dtype, False), executor=executor, workers=threads or 1
                )
                np.testing.assert_allclose(out_only.output, want.output, atol=1e-12)
    finally:
        if executor:
            executor.shutdown()


def test_core_imports_no_web_framework() -> None:
    import subprocess
    import sys

    code = (
        "import sys, service.core.attention, service.core.masks, service.core.normalizers, "
        "service.core.diagnostics, service.core.probabilities, service.engines.numpy_engine;"
        "bad = [m for m in ('fastapi', 'pydantic', 'starlette') if m in sys.modules];"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
