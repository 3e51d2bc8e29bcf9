"""The backward pass against central finite differences in float64; Jacobian norms against explicit Jacobians."""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest

from service.core import normalizers
from service.core.attention import attention
from service.core.backward import BackwardTask, jacobian_norms, run_backward, sum_to_shape
from service.core.errors import InvalidInput, NumericalError
from service.core.types import AttentionInputs, AttentionParams, AttentionTask

NORMALIZERS = [("softmax", None), ("sparsemax", None), ("entmax15", None), ("entmax", 1.3), ("relu", None)]
ALL = frozenset(
    {"grad_query", "grad_key", "grad_value", "grad_mask", "grad_scale", "grad_temperature", "output", "weights"}
)
EPS = 1e-6


def rand(rng: np.random.Generator, *shape: int, scale: float = 1.0) -> np.ndarray:
    return rng.standard_normal(shape) * scale


# Mask set-ups: (name, L, S, builder(rng, B, Hq) -> (mask, key_lengths), causal)
def _none(rng, B, Hq, L, S):
    return None, None


def _float_mask(rng, B, Hq, L, S):
    m = rand(rng, 1, Hq, L, S)
    m[0, 0, 1, 2] = -np.inf  # a position the float mask removes
    return m, None


def _float_mask_broadcast(rng, B, Hq, L, S):
    return rand(rng, B, 1, 1, S), None  # summed over heads and query rows


def _bool_and_lengths(rng, B, Hq, L, S):
    keep = rng.random((B, 1, L, S)) > 0.25
    return keep, np.array([S - 1, 2])


SETUPS = [
    ("plain", 3, 4, _none, None),
    ("float-mask", 3, 5, _float_mask, None),
    ("float-mask-broadcast+top_left", 4, 4, _float_mask_broadcast, "top_left"),
    ("bool+key_lengths", 3, 5, _bool_and_lengths, None),
    ("bottom_right L<S", 2, 5, _none, "bottom_right"),
    ("bottom_right L>S", 5, 3, _float_mask, "bottom_right"),
    ("top_left L<S", 3, 5, _float_mask_broadcast, "top_left"),
]


def _loss(q, k, v, mask, lengths, params, g, gw) -> float:
    r = attention(q, k, v, mask=mask, key_lengths=lengths, params=params, dtype=np.float64, need_weights=True)
    return float((r.output * g).sum() + (r.weights * gw).sum())


def _numeric(f, x: np.ndarray) -> np.ndarray:
    out = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        if not np.isfinite(x[idx]):
            continue
        xp, xm = x.copy(), x.copy()
        xp[idx] += EPS
        xm[idx] -= EPS
        out[idx] = (f(xp) - f(xm)) / (2 * EPS)
    return out


@pytest.mark.parametrize("normalizer,alpha", NORMALIZERS, ids=[n for n, _ in NORMALIZERS])
@pytest.mark.parametrize("setup", SETUPS, ids=[s[0] for s in SETUPS])
def test_every_gradient_matches_finite_differences(normalizer: str, alpha: float | None, setup: Any) -> None:
    _, L, S, build, causal = setup
    rng = np.random.default_rng(hash((normalizer, setup[0])) % 2**32)
    B, Hq, Hkv, E, Ev = 2, 4, 2, 3, 2  # grouped-query: two query heads per kv head
    q, k, v = rand(rng, B, Hq, L, E), rand(rng, B, Hkv, S, E), rand(rng, B, Hkv, S, Ev)
    mask, lengths = build(rng, B, Hq, L, S)
    g, gw = rand(rng, B, Hq, L, Ev), rand(rng, B, Hq, L, S)
    scale, T = 0.7, 0.8
    params = AttentionParams(normalizer=normalizer, alpha=alpha, scale=scale, temperature=T, causal=causal)
    want = ALL if mask is not None and mask.dtype != bool else ALL - {"grad_mask"}
    task = AttentionTask(AttentionInputs(q, k, v, mask, lengths), params, np.dtype(np.float64))
    r = run_backward(BackwardTask(task, g, gw, want=want))

    def loss(q_=q, k_=k, v_=v, mask_=mask, p_=params) -> float:
        return _loss(q_, k_, v_, mask_, lengths, p_, g, gw)

    np.testing.assert_allclose(r.grad_query, _numeric(lambda x: loss(q_=x), q), atol=2e-6, err_msg="grad_query")
    np.testing.assert_allclose(r.grad_key, _numeric(lambda x: loss(k_=x), k), atol=2e-6, err_msg="grad_key")
    np.testing.assert_allclose(r.grad_value, _numeric(lambda x: loss(v_=x), v), atol=2e-6, err_msg="grad_value")
    ds = (loss(p_=_with(params, scale=scale + EPS)) - loss(p_=_with(params, scale=scale - EPS))) / (2 * EPS)
    dt = (loss(p_=_with(params, temperature=T + EPS)) - loss(p_=_with(params, temperature=T - EPS))) / (2 * EPS)
    assert r.grad_scale == pytest.approx(ds, abs=2e-6)
    assert r.grad_temperature == pytest.approx(dt, abs=2e-6)
    if "grad_mask" in want:
        assert r.grad_mask is not None and r.grad_mask.shape == mask.shape
        np.testing.assert_allclose(r.grad_mask, _numeric(lambda x: loss(mask_=x), mask), atol=2e-6)
        assert (r.grad_mask[np.isneginf(mask)] == 0).all()
    forward = attention(q, k, v, mask=mask, key_lengths=lengths, params=params, dtype=np.float64)
    np.testing.assert_allclose(r.output, forward.output, atol=1e-12)
    np.testing.assert_allclose(r.weights, forward.weights, atol=1e-12)
    # keys that no query row attends (masked, or outside a sparse support) get exactly zero gradient
    unattended = forward.weights.reshape(B, Hkv, Hq // Hkv, L, S).sum(axis=(2, 3)) == 0
    assert (r.grad_key[unattended] == 0).all() and (r.grad_value[unattended] == 0).all()
    assert (r.weights[forward.weights == 0] == 0).all()


def _with(params: AttentionParams, **kw: Any) -> AttentionParams:
    fields = {f: getattr(params, f) for f in ("normalizer", "alpha", "scale", "temperature", "causal")}
    return AttentionParams(**{**fields, **kw})


@pytest.mark.parametrize("normalizer,alpha", NORMALIZERS, ids=[n for n, _ in NORMALIZERS])
@pytest.mark.parametrize("lead", [(), (2,)], ids=["rank2", "rank3"])
def test_default_scale_gradient_and_ranks_2_and_3(normalizer: str, alpha: float | None, lead: tuple[int, ...]) -> None:
    """Without an explicit scale, grad_scale is the derivative at 1/sqrt(E); ranks 2 and 3 keep their shapes."""
    rng = np.random.default_rng(3)
    q, k, v = rand(rng, *lead, 3, 4), rand(rng, *lead, 5, 4), rand(rng, *lead, 5, 2)
    g = rand(rng, *lead, 3, 2)
    params = AttentionParams(normalizer=normalizer, alpha=alpha)
    task = AttentionTask(AttentionInputs(q, k, v), params, np.dtype(np.float64))
    r = run_backward(BackwardTask(task, g, want=frozenset({"grad_query", "grad_key", "grad_value", "grad_scale"})))
    assert r.grad_query.shape == q.shape and r.grad_key.shape == k.shape and r.grad_value.shape == v.shape
    s0 = 1 / math.sqrt(4)

    def loss(s: float = s0, v_: np.ndarray = v) -> float:
        return float((attention(q, k, v_, params=_with(params, scale=s), dtype=np.float64).output * g).sum())

    assert r.grad_scale == pytest.approx((loss(s0 + EPS) - loss(s0 - EPS)) / (2 * EPS), abs=2e-6)
    np.testing.assert_allclose(r.grad_value, _numeric(lambda x: loss(v_=x), v), atol=2e-6)
    np.testing.assert_allclose(
        r.grad_query,
        _numeric(lambda x: float((attention(x, k, v, params=params, dtype=np.float64).output * g).sum()), q),
        atol=2e-6,
    )


@pytest.mark.parametrize("normalizer,alpha", NORMALIZERS, ids=[n for n, _ in NORMALIZERS])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fully_masked_rows_give_zero_gradients(normalizer: str, alpha: float | None, dtype: type) -> None:
    rng = np.random.default_rng(5)
    q, k, v = rand(rng, 2, 2, 3, 4), rand(rng, 2, 2, 4, 4), rand(rng, 2, 2, 4, 3)
    mask = np.zeros((2, 2, 3, 4))
    mask[0, 1, 2] = -np.inf  # one row masked out by the float mask
    lengths = np.array([4, 0])  # batch 1: no key at all
    task = AttentionTask(
        AttentionInputs(q, k, v, mask, lengths), AttentionParams(normalizer=normalizer, alpha=alpha), np.dtype(dtype)
    )
    r = run_backward(BackwardTask(task, rand(rng, 2, 2, 3, 3), rand(rng, 2, 2, 3, 4), want=ALL | {"gradient_health"}))
    for name in ("grad_query", "grad_key", "grad_value", "grad_mask", "output", "weights"):
        arr = getattr(r, name)
        assert np.isfinite(arr).all() and arr.dtype == dtype, name
    assert (r.grad_query[1] == 0).all() and (r.grad_key[1] == 0).all() and (r.grad_value[1] == 0).all()
    assert (r.grad_query[0, 1, 2] == 0).all() and (r.grad_mask[0, 1, 2] == 0).all() and (r.grad_mask[1] == 0).all()
    assert math.isfinite(r.grad_scale) and math.isfinite(r.grad_temperature)
    assert r.gradient_health is not None and r.gradient_health.rows[1].tolist() == [0, 0]


def test_float32_agrees_with_float64_and_threads_do_not_change_results(monkeypatch) -> None:
    from service.core.attention import chunks

    rng = np.random.default_rng(11)
    q, k, v = rand(rng, 2, 6, 9, 8), rand(rng, 2, 3, 7, 8), rand(rng, 2, 3, 7, 5)
    mask = rand(rng, 2, 1, 9, 7)
    g = rand(rng, 2, 6, 9, 5)
    want = ALL | {"gradient_health"}
    params = AttentionParams(causal="bottom_right", temperature=1.3)
    ref = run_backward(
        BackwardTask(AttentionTask(AttentionInputs(q, k, v, mask), params, np.dtype(np.float64)), g, want=want)
    )
    f32 = run_backward(
        BackwardTask(AttentionTask(AttentionInputs(q, k, v, mask), params, np.dtype(np.float32)), g, want=want)
    )
    for name in ("grad_query", "grad_key", "grad_value", "grad_mask", "output", "weights"):
        np.testing.assert_allclose(getattr(f32, name), getattr(ref, name), atol=2e-5, err_msg=name)
    assert f32.grad_scale == pytest.approx(ref.grad_scale, abs=1e-4)
    monkeypatch.setattr(chunks, "CHUNK_ELEMENTS", 20)
    monkeypatch.setattr(chunks, "MIN_CHUNK_ELEMENTS", 1)
    monkeypatch.setattr(chunks, "PARALLEL_MIN_ELEMENTS", 1)  # the backward is chunked by chunks.run_chunks too
    with ThreadPoolExecutor(2) as ex:
        chunked = run_backward(
            BackwardTask(AttentionTask(AttentionInputs(q, k, v, mask), params, np.dtype(np.float64)), g, want=want),
            executor=ex,
            workers=2,
        )
    for name in ("grad_query", "grad_key", "grad_value", "grad_mask", "output", "weights"):
        np.testing.assert_allclose(getattr(chunked, name), getattr(ref, name), atol=1e-12, err_msg=name)
    assert chunked.grad_temperature == pytest.approx(ref.grad_temperature, abs=1e-12)
    np.testing.assert_allclose(
        chunked.gradient_health.mean_jacobian_norm, ref.gradient_health.mean_jacobian_norm, atol=1e-12
    )


@pytest.mark.parametrize("normalizer,alpha", NORMALIZERS, ids=[n for n, _ in NORMALIZERS])
def test_jacobian_norms_match_explicit_jacobians(normalizer: str, alpha: float | None) -> None:
    rng = np.random.default_rng(2)
    z = rand(rng, 6, 5, scale=1.5)
    z[0, 3] = -np.inf  # masked
    z[1] = -np.inf  # fully masked row
    z[2] = [8.0, -5.0, -6.0, -4.0, -7.0]  # nearly one-hot
    p = normalizers.normalize(z, normalizer, alpha=alpha)
    got = jacobian_norms(normalizer, p, z=z, alpha=alpha)
    for i in range(z.shape[0]):
        J = np.zeros((5, 5))
        for j in range(5):
            if not np.isfinite(z[i, j]):
                continue
            zp, zm = z[i].copy(), z[i].copy()
            zp[j] += EPS
            zm[j] -= EPS
            J[:, j] = (
                normalizers.normalize(zp, normalizer, alpha=alpha) - normalizers.normalize(zm, normalizer, alpha=alpha)
            ) / (2 * EPS)
        assert got[i] == pytest.approx(np.linalg.norm(J), abs=2e-6), i
    assert got[1] == 0


def test_softmax_jacobian_norm_is_semantics_closed_form_and_sparsemax_sqrt_support() -> None:
    p = normalizers.softmax(np.array([2.1, 0.5, -1.2, 3.0]))
    s2, s3 = (p**2).sum(), (p**3).sum()
    assert jacobian_norms("softmax", p) == pytest.approx(math.sqrt(s2 - 2 * s3 + s2**2), abs=1e-15)
    sp = normalizers.sparsemax(np.array([1.8, -0.3, 2.5, 0.1]))  # support {0, 2}: J = I - 11^T/2 on it
    assert jacobian_norms("sparsemax", sp) == pytest.approx(1.0, abs=1e-15)


def test_sum_to_shape() -> None:
    x = np.arange(24.0).reshape(2, 3, 1, 4)
    assert sum_to_shape(x, (1, 3, 1, 1)).tolist() == x.sum(axis=(0, 3), keepdims=True).tolist()
    assert sum_to_shape(x, x.shape) is x


def test_bad_inputs_are_named() -> None:
    rng = np.random.default_rng(0)
    q, k, v = rand(rng, 3, 4), rand(rng, 5, 4), rand(rng, 5, 2)
    task = AttentionTask(AttentionInputs(q, k, v), AttentionParams(), np.dtype(np.float64))
    with pytest.raises(InvalidInput) as e:
        run_backward(BackwardTask(task, rand(rng, 3, 3)))
    assert e.value.loc == ("grad_output",)
    with pytest.raises(InvalidInput) as e:
        run_backward(BackwardTask(task, rand(rng, 3, 2), rand(rng, 3, 4)))
    assert e.value.loc == ("grad_weights",)
    with pytest.raises(InvalidInput) as e:
        run_backward(BackwardTask(task, rand(rng, 3, 2), want=frozenset({"grad_mask"})))
    assert e.value.loc == ("mask",)
    bool_task = AttentionTask(AttentionInputs(q, k, v, np.ones((3, 5), bool)), AttentionParams(), np.dtype(np.float64))
    with pytest.raises(InvalidInput):
        run_backward(BackwardTask(bool_task, rand(rng, 3, 2), want=frozenset({"grad_mask"})))
    with pytest.raises(InvalidInput) as e:
        run_backward(BackwardTask(task, np.full((3, 2), np.nan)))
    assert e.value.loc == ("grad_output",)


def test_float32_overflow_is_a_numerical_error() -> None:
    q = np.full((2, 2), 1e20, dtype=np.float32)
    task = AttentionTask(AttentionInputs(q, q, q), AttentionParams(scale=1.0), np.dtype(np.float32))
    with pytest.raises(NumericalError):
        run_backward(BackwardTask(task, np.ones((2, 2), dtype=np.float32)))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_relu_backward_does_not_depend_on_the_temperature(dtype: type) -> None:
    """relu(Z / T) / sum(relu(Z / T)) is the same for every T > 0: so are its gradients, its temperature
    gradient is 0, and a temperature that overflows float32 scores is no error (as in the forward pass).
    """
    rng = np.random.default_rng(7)
    q, k, v = (rand(rng, 2, 2, 5, 3).astype(dtype) for _ in range(3))
    mask = rand(rng, 2, 2, 5, 5).astype(dtype)
    g = rand(rng, 2, 2, 5, 3).astype(dtype)
    want = ALL | {"gradient_health"}

    def backward(temperature: float) -> Any:
        params = AttentionParams(normalizer="relu", scale=0.9, temperature=temperature)
        return run_backward(
            BackwardTask(AttentionTask(AttentionInputs(q, k, v, mask), params, np.dtype(dtype)), g, want=want)
        )

    at_one = backward(1.0)
    assert np.abs(at_one.grad_query).max() > 0.1  # rows with several positive scores: a real gradient
    for temperature in (0.3, 1e-30, 1e-40):
        r = backward(temperature)
        for name in ("grad_query", "grad_key", "grad_value", "grad_mask", "output", "weights"):
            np.testing.assert_array_equal(getattr(r, name), getattr(at_one, name), err_msg=name)
        assert r.grad_scale == at_one.grad_scale
        assert r.grad_temperature == 0.0
        assert r.gradient_health is not None and at_one.gradient_health is not None
        np.testing.assert_allclose(  # J(Z / T) = T J(Z)
            r.gradient_health.mean_jacobian_norm, temperature * at_one.gradient_health.mean_jacobian_norm, rtol=1e-12
        )
    params = AttentionParams(normalizer="relu", scale=0.9, temperature=1e-40)
    forward = attention(q, k, v, mask=mask, params=params, dtype=dtype)
    # both passes form relu's scores and weights in float64 and round only the results: the same numbers
    np.testing.assert_array_equal(forward.weights, at_one.weights)
    np.testing.assert_array_equal(forward.output, at_one.output)


# (scale, magnitude of q and k): float32 scores that would underflow to 0 (a silent zero gradient before),
# overflow past 3.4e38, or turn subnormal, while every gradient itself fits float32.
RELU_EXTREMES = [(1e-46, 1.0), (1e30, 1e5), (1.0, 1e20), (1e-20, 1e-10), (0.9, 1.0)]


@pytest.mark.parametrize(("scale", "size"), RELU_EXTREMES)
@pytest.mark.parametrize("masked", [False, True], ids=["no-mask", "float-mask"])
def test_relu_backward_in_float32_is_the_float64_answer_rounded(scale: float, size: float, masked: bool) -> None:
    """A float32 relu request's gradients are those of float64 to float32 precision, and its weights and output
    are the forward pass's exactly, wherever the answers fit float32 (the scores need not).
    """
    rng = np.random.default_rng(11)
    q, k = rand(rng, 1, 2, 4, 3, scale=size), rand(rng, 1, 2, 6, 3, scale=size)
    v, g = rand(rng, 1, 2, 6, 3), rand(rng, 1, 2, 4, 3)
    mask = None
    if masked:  # a bias of the scores' own size (or float32's largest), and one position removed
        mask = rand(rng, 1, 1, 4, 6, scale=0.3 * min(scale * size * size, 1e37))
        mask[..., 2] = -np.inf
    # both precisions get the same (float32) numbers: the difference left is how each computes
    q, k, v, g = (x.astype(np.float32) for x in (q, k, v, g))
    mask = None if mask is None else mask.astype(np.float32)
    params = AttentionParams(normalizer="relu", scale=scale)
    want = ALL - {"grad_temperature"} | {"gradient_health"}
    # the mask's gradient is dZ itself, ~1 / |scores|: it fits float32 only for scores of ordinary size
    if mask is None or not 1e-3 < scale * size * size < 1e3:
        want = want - {"grad_mask"}
    got = {}
    for dtype in (np.float32, np.float64):
        task = AttentionTask(AttentionInputs(q, k, v, mask), params, np.dtype(dtype))
        got[dtype] = run_backward(BackwardTask(task, g, want=want))
    r32, r64 = got[np.float32], got[np.float64]
    for name in ("grad_query", "grad_key", "grad_value", "grad_mask", "weights", "output"):
        if name in want:
            assert getattr(r32, name).dtype == np.float32
            np.testing.assert_allclose(
                getattr(r32, name), getattr(r64, name), rtol=2e-6, atol=2e-6 * np.abs(getattr(r64, name)).max()
            )
    assert np.abs(r64.grad_query).max() > 0 and np.abs(r64.grad_key).max() > 0
    if mask is None:  # degree-0 homogeneous in the scores (Euler): exactly 0, in both precisions
        assert r32.grad_scale == 0.0 and r64.grad_scale == 0.0
    else:
        assert r32.grad_scale == pytest.approx(r64.grad_scale, rel=1e-5)
    assert r32.gradient_health is not None and r64.gradient_health is not None
    np.testing.assert_allclose(
        r32.gradient_health.mean_jacobian_norm, r64.gradient_health.mean_jacobian_norm, rtol=1e-6
    )
    forward = attention(q, k, v, mask=mask, params=params, dtype=np.float32)
    np.testing.assert_array_equal(r32.weights, forward.weights)
    np.testing.assert_array_equal(r32.output, forward.output)


def test_relu_mask_gradient_past_float32_is_a_numerical_error() -> None:
    """Scores ~1e-46 give a mask gradient ~1e46: float32 refuses (with the float64 hint), float64 answers."""
    rng = np.random.default_rng(5)
    q, k, v, g = rand(rng, 3, 2), rand(rng, 4, 2), rand(rng, 4, 2), rand(rng, 3, 2)
    mask = rand(rng, 3, 4, scale=1e-47)
    params = AttentionParams(normalizer="relu", scale=1e-46)
    want = frozenset({"grad_query", "grad_mask"})
    with pytest.raises(NumericalError, match="grad_mask is not finite in float32.*float64"):
        run_backward(
            BackwardTask(AttentionTask(AttentionInputs(q, k, v, mask), params, np.dtype(np.float32)), g, want=want)
        )
    r = run_backward(
        BackwardTask(AttentionTask(AttentionInputs(q, k, v, mask), params, np.dtype(np.float64)), g, want=want)
    )
    assert np.isfinite(r.grad_mask).all() and np.abs(r.grad_mask).max() > 1e40


@pytest.mark.parametrize("factor", [1e-200, 1e-300, 1e200, 4e307])
def test_relu_jacobian_norms_and_backward_scale_with_the_scores(factor: float) -> None:
    """ReLU weights are homogeneous of degree 0: at scores ``c z`` the Jacobian is ``J(z) / c`` and the
    gradient ``dz / c``, also where ``s^2`` underflows or the row sum overflows (no spurious 0 or inf).
    """
    rng = np.random.default_rng(3)
    z = rng.standard_normal((4, 7)) + 0.5
    z[1] = -1.0  # a row without support: zeros
    g = rng.standard_normal((4, 7))
    p = normalizers.relu_normalize(z)
    big = z * factor  # at 4e307 every score is finite but a row's sum of them is not
    expected_dz = normalizers.relu_backward(z, g) / factor
    assert np.all(np.isfinite(expected_dz)) and np.abs(expected_dz).max() > 0
    tiny = np.finfo(np.float64).tiny  # values below float64's normal range (at 4e307) may come out as 0
    norms = jacobian_norms("relu", p, z=big)
    np.testing.assert_allclose(norms, jacobian_norms("relu", p, z=z) / factor, rtol=1e-12, atol=tiny)
    np.testing.assert_allclose(normalizers.relu_backward(big, g), expected_dz, rtol=1e-12, atol=tiny)
