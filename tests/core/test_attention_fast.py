"""The shortcuts for small tasks: the one-pass path (``forward_small``) against the chunked path (the same
numbers, bit for bit), and the per-size caches and no-op skips on the way.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest

import service.core.attention as core
from service.core.attention import forward, prepared
from service.core.errors import NumericalError
from service.core.types import AttentionInputs, AttentionParams, AttentionResult, AttentionTask

NORMALIZERS = [
    ("softmax", None),
    ("sparsemax", None),
    ("entmax15", None),
    ("entmax", 1.5),
    ("entmax", 2.0),
    ("entmax", 1.3),
    ("relu", None),
]


def both_paths(monkeypatch: pytest.MonkeyPatch, task: AttentionTask) -> tuple[AttentionResult, AttentionResult]:
    """(one-pass result, chunked result) of ``task``."""
    monkeypatch.setattr(forward, "FAST_PATH_SCORES", 1 << 30)
    fast = core.run_attention(task)
    monkeypatch.setattr(forward, "FAST_PATH_SCORES", -1)
    chunked = core.run_attention(task)
    return fast, chunked


def assert_identical(fast: AttentionResult, chunked: AttentionResult) -> None:
    for name in ("output", "weights", "scores", "valid_keys"):
        a, b = getattr(fast, name), getattr(chunked, name)
        if b is None:
            assert a is None, name
            continue
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert np.array_equal(a, b), f"{name}: max difference {np.max(np.abs(a - b))}"


def random_masks(rng: np.random.Generator, B: int, Hq: int, L: int, S: int, dtype: type) -> list[np.ndarray | None]:
    """No mask, a full boolean mask, a broadcast boolean mask and float masks with -inf (one of them per-head)."""
    keep = rng.random((B, Hq, L, S)) > 0.35
    keep_rows = rng.random((L, S)) > 0.35
    bias = rng.standard_normal((1, Hq, 1, S)).astype(dtype)
    bias[rng.random(bias.shape) < 0.3] = -np.inf
    bias_full = (3 * rng.standard_normal((B, Hq, L, S))).astype(dtype)
    bias_full[rng.random(bias_full.shape) < 0.2] = -np.inf
    return [None, keep, keep_rows, bias, bias_full]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("normalizer", "alpha"), NORMALIZERS)
def test_fast_path_is_bit_identical_to_chunked(monkeypatch: pytest.MonkeyPatch, dtype: type, normalizer, alpha) -> None:
    rng = np.random.default_rng(zlib.crc32(f"{normalizer} {alpha} {np.dtype(dtype).name}".encode()))
    for trial in range(12):
        B, Hkv, G = int(rng.integers(1, 4)), int(rng.integers(1, 3)), int(rng.integers(1, 3))
        L, S, E, Ev = (int(x) for x in rng.integers(1, 8, size=4))
        Hq = Hkv * G
        q = 2 * rng.standard_normal((B, Hq, L, E))
        k = 2 * rng.standard_normal((B, Hkv, S, E))
        v = rng.standard_normal((B, Hkv, S, Ev))
        for m, mask in enumerate(random_masks(rng, B, Hq, L, S, dtype)):
            causal = (None, "top_left", "bottom_right")[(trial + m) % 3]
            key_lengths = rng.integers(0, S + 1, size=B) if (trial + m) % 2 else None
            params = AttentionParams(
                normalizer=normalizer,
                alpha=alpha,
                scale=None if trial % 3 else float(rng.uniform(0.1, 2.0)),
                temperature=(1.0, 0.5, 3.7)[trial % 3],
                causal=causal,
            )
            for need_weights, need_scores in ((True, True), (True, False), (False, False), (False, True)):
                task = AttentionTask(
                    AttentionInputs(q, k, v, mask, key_lengths), params, np.dtype(dtype), need_weights, need_scores
                )
                assert_identical(*both_paths(monkeypatch, task))


@pytest.mark.parametrize(("normalizer", "alpha"), NORMALIZERS)
def test_fast_path_fully_masked_rows_and_low_ranks(monkeypatch: pytest.MonkeyPatch, normalizer, alpha) -> None:
    """Rows with no key left (key_lengths 0, a mask row of False or -inf) are zeros on both paths; rank 2 and 3."""
    rng = np.random.default_rng(7)
    q, k, v = rng.standard_normal((2, 3, 4, 5)), rng.standard_normal((2, 3, 6, 5)), rng.standard_normal((2, 3, 6, 2))
    keep = rng.random((2, 3, 4, 6)) > 0.3
    keep[0, 1, 2] = False
    bias = rng.standard_normal((2, 3, 4, 6))
    bias[1, 0, 3] = -np.inf
    for mask, key_lengths in ((keep, None), (bias, np.array([0, 6])), (None, np.array([3, 0]))):
        task = AttentionTask(AttentionInputs(q, k, v, mask, key_lengths), AttentionParams(normalizer, alpha))
        fast, chunked = both_paths(monkeypatch, task)
        assert_identical(fast, chunked)
        dead = fast.valid_keys == 0
        assert dead.any() and fast.weights is not None
        assert not fast.weights[dead].any() and not fast.output[dead].any()
    for shape in ((4, 5), (3, 4, 5)):
        x = rng.standard_normal(shape)
        task = AttentionTask(AttentionInputs(x, x, x), AttentionParams(normalizer, alpha), need_scores=True)
        assert_identical(*both_paths(monkeypatch, task))


def test_fast_path_raises_what_the_chunked_path_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    """float32 scores that overflow at a kept position: the same NumericalError on both paths."""
    q = np.full((1, 1, 2, 2), 1e20)
    task = AttentionTask(AttentionInputs(q, q, q), AttentionParams(), np.dtype(np.float32), True, True)
    messages = []
    for threshold in (1 << 30, -1):
        monkeypatch.setattr(forward, "FAST_PATH_SCORES", threshold)
        with pytest.raises(NumericalError) as err:
            core.run_attention(task)
        messages.append(str(err.value))
    assert messages[0] == messages[1]


@pytest.mark.parametrize(("shape", "fast"), [((1, 1, 4, 4), True), ((2, 8, 32, 64), True), ((2, 8, 32, 65), False)])
def test_threshold_switch(monkeypatch: pytest.MonkeyPatch, shape: tuple[int, int, int, int], fast: bool) -> None:
    """Tasks of at most FAST_PATH_SCORES = 2**15 scores (B*Hq*L*S) take the one-pass path, larger ones the chunks."""
    assert forward.FAST_PATH_SCORES == 1 << 15
    B, H, L, S = shape
    calls: list[str] = []
    small, chunked = forward.forward_small, forward.forward_chunked
    monkeypatch.setattr(forward, "forward_small", lambda *a: calls.append("fast") or small(*a))
    monkeypatch.setattr(forward, "forward_chunked", lambda *a: calls.append("chunked") or chunked(*a))
    x = np.ones((B, H, L, 4)), np.ones((B, H, S, 4))
    core.run_attention(AttentionTask(AttentionInputs(x[0], x[1], x[1])))
    assert calls == (["fast"] if fast else ["chunked"])
    assert (B * H * L * S <= forward.FAST_PATH_SCORES) == fast


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_scaled_bias_at_temperature_one_is_the_bias(dtype: type) -> None:
    """Dividing by 1 in float64 and rounding back to the mask's own dtype changes nothing: the mask is reused."""
    rng = np.random.default_rng(3)
    bias = (rng.standard_normal((1, 2, 3, 4)) * 10.0 ** rng.integers(-30, 30, size=(1, 2, 3, 4))).astype(dtype)
    bias[0, 1, 2] = -np.inf
    general = (bias.astype(np.float64) / 1.0).astype(dtype)
    assert core.scaled_bias(bias, 1.0, dtype) is bias
    assert np.array_equal(general, bias)
    given = bias.astype(np.float64 if dtype == np.float32 else np.float32)  # another dtype: converted
    other = core.scaled_bias(given, 1.0, dtype)
    assert other.dtype == np.dtype(dtype) and np.array_equal(other, given.astype(dtype))
    halved = core.scaled_bias(bias, 2.0, dtype)
    assert halved is not bias and np.array_equal(halved, (bias.astype(np.float64) / 2.0).astype(dtype))


def test_causal_keep_is_shared_and_read_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """A causal-only mask of a small task is built once per (L, S, alignment) and cannot be written through."""
    from service.core.masks import combine_keep

    a = prepared.cached_causal_keep(3, 5, "bottom_right")
    assert a is prepared.cached_causal_keep(3, 5, "bottom_right") and not a.flags.writeable
    want = combine_keep(None, None, causal="bottom_right", key_lengths=None, batch=1, L=3, S=5)
    assert want is not None and np.array_equal(a, want)


def test_check_dims_is_cached_per_shapes_and_errors_are_not() -> None:
    from service.core.errors import InvalidInput

    a = core.check_dims((1, 2, 3, 4), (1, 1, 5, 4), (1, 1, 5, 6))
    assert a is core.check_dims([1, 2, 3, 4], (1, 1, 5, 4), (1, 1, 5, 6))  # any sequence of sizes
    assert (a.Hq, a.Hkv, a.group, a.S, a.Ev) == (2, 1, 2, 5, 6)
    for _ in range(2):
        with pytest.raises(InvalidInput, match="key has E=3 but query has E=4"):
            core.check_dims((1, 2, 3, 4), (1, 1, 5, 3), (1, 1, 5, 6))
