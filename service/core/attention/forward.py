"""The forward pass: ``output = normalizer((scale * Q K^T + bias) / T) V`` on numpy (the contract's "The forward pass").

A task of at most :data:`FAST_PATH_SCORES` scores runs in one pass over arrays with a leading batch
axis (:func:`forward_small`); larger ones chunk by chunk (:func:`forward_chunked`, on
:mod:`.chunks`). Both run the same operations in the same order, so they give the same numbers, bit
for bit (``tests/core/test_attention_fast.py``).
"""

from __future__ import annotations

from concurrent.futures import Executor

import numpy as np

from service.core import normalizers
from service.core.attention.chunks import (
    Chunk,
    chunk_rows,
    chunk_scores,
    chunk_valid,
    mask_chunk,
    relu_scores,
    run_chunks,
)
from service.core.attention.numerics import (
    check_live_rows,
    check_scores_finite,
    output_overflow_error,
    overflow_error,
)
from service.core.attention.prepared import Prepared, prepare, split_heads
from service.core.types import AttentionInputs, AttentionParams, AttentionResult, AttentionTask

# Up to this many scores (B*Hq*L*S) in all, run_attention computes the whole task in one pass
# (:func:`forward_small`) instead of planning and iterating chunks: a (1, 1, 4, 4) request spends
# most of its time in per-call Python overhead, not in arithmetic. At most MIN_CHUNK_ELEMENTS, so the
# chunked path would run each batch as one chunk too, and below PARALLEL_MIN_ELEMENTS (no threads).
FAST_PATH_SCORES = 1 << 15


def _exp_shifted(z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """In place ``z <- exp(z - rowmax)``; returns the row sums, with 0 (fully masked rows) replaced by 1,
    and which rows had no finite score (all ``-inf``).
    """
    m = z.max(axis=-1, keepdims=True)
    dead = m == -np.inf  # np.isneginf is three ufunc calls
    m[dead] = 0  # a fully masked row: exp(-inf - 0) = 0, not exp(-inf + inf) = NaN
    z -= m
    np.exp(z, out=z)
    s: np.ndarray = z.sum(axis=-1, keepdims=True)
    s[dead] = 1  # the rows summing to 0: any other row holds exp(0) = 1 (or a NaN)
    return s, dead[..., 0]


def _relu_weights(
    p: Prepared,
    q: np.ndarray,
    k: np.ndarray,
    bias: np.ndarray | None,
    drop: np.ndarray | None,
    scores_out: np.ndarray | None,
) -> np.ndarray:
    """ReLU weights (..., G * L, S) in float64 from ``y = scale * Q K^T + bias``, for queries ``q``
    (..., G, L, E) against keys ``k`` (..., S, E); ``bias`` and ``drop`` broadcast to (..., G, L, S).

    ``relu(y / T) / sum relu(y / T)`` does not depend on T > 0, so the temperature is left out (a
    temperature of 1e300, or one that makes the scores overflow, cannot turn a row into zeros), and y is
    formed in float64, where a float32 request's scores can neither overflow nor underflow. The row is
    then scaled by its largest value before summing (docs/concepts/normalizers.md, "relu";
    :func:`normalizers.relu_normalize`).
    ``scores_out`` (when given, shaped as the weights) receives the scores ``y / T`` rounded to its dtype.
    """
    y = relu_scores(p, q, k, bias, drop)
    if scores_out is not None:
        scores_out[...] = y / p.temperature
        grouped = scores_out.reshape(q.shape[:-1] + (y.shape[-1],))
        check_scores_finite(grouped, None if drop is None else ~drop, scores_out.dtype)
    return normalizers.relu_normalize(y)


def _relu_chunk(p: Prepared, c: Chunk, scores_out: np.ndarray | None) -> np.ndarray:
    """ReLU weights of chunk ``c`` (kv heads, rows, S) in float64 (:func:`_relu_weights`)."""
    return _relu_weights(
        p, p.q5[c.b, c.kv, c.g, c.l], p.k[c.b, c.kv], mask_chunk(p.raw_bias5, c), mask_chunk(p.drop5, c), scores_out
    )


def _forward_chunk(
    p: Prepared,
    c: Chunk,
    normalizer: str,
    alpha: float | None,
    output5: np.ndarray,
    weights5: np.ndarray | None,
    scores5: np.ndarray | None,
) -> None:
    """Fill chunk ``c`` of the output (and of the weights and scores when given)."""
    d = p.dims
    out = chunk_rows(output5, c)
    if weights5 is not None:
        z = chunk_rows(weights5, c)
    else:
        z = np.empty((out.shape[0], out.shape[1], d.S), dtype=out.dtype)
    # float32 scores beyond ~3e38 overflow: reported as a NumericalError (never a dead row or a null).
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        v = p.v[c.b, c.kv]
        if normalizer == "relu":
            a = _relu_chunk(p, c, None if scores5 is None else chunk_rows(scores5, c))
            _mix_relu(a, z, v, out, keep_weights=weights5 is not None)
            return
        chunk_scores(p, c, z, check=scores5 is not None)
        if scores5 is not None:
            chunk_rows(scores5, c)[...] = z
        _normalize_and_mix(z, v, out, chunk_valid(p, c), normalizer, alpha, keep_weights=weights5 is not None)


def _mix_relu(a: np.ndarray, z: np.ndarray, v: np.ndarray, out: np.ndarray, *, keep_weights: bool) -> None:
    """``out = A v`` for ReLU weights ``a`` computed in float64 (:func:`_relu_weights`), in ``out``'s dtype; with
    ``keep_weights`` they are stored in ``z`` first and the product uses those (the weights the answer returns).
    """
    if keep_weights:
        z[...] = a
        np.matmul(z, v, out=out)
    else:
        np.matmul(a.astype(out.dtype), v, out=out)


def _mix_then_normalize(e: np.ndarray, v: np.ndarray, out: np.ndarray, sums: np.ndarray) -> None:
    """``out = (e / sums) v`` for softmax's unnormalized exponentials ``e`` (..., rows, S; each in [0, 1], row sums
    ``sums``), when the weights are not returned.

    The (rows, Ev) product ``e v`` is divided by the sums instead of the (rows, S) exponentials: a pass over
    the exponentials less, and the same numbers as before for ordinary values. But ``e v`` reaches
    ``sums * max |v|``, up to S times the answer: near-uniform rows of 4,096 keys overflow float32 from
    ``|v| = 8.3e34``, two keys of equal weight from ``|v| = 1.7e38``, though the answer is at most
    ``max |v|``. Only a row whose product overflowed (not finite; the weights are finite here) is computed
    again the way the weights path computes it, normalizing first, so the output does not depend on what
    ``return`` asks for (docs/concepts/numeric-edges.md). Row by row, so a row's numbers do not depend on
    the rows it is computed with (the fast and the chunked paths stay bit-identical).
    """
    np.matmul(e, v, out=out)
    out /= sums
    if np.isfinite(out).all():
        return
    redo = ~np.isfinite(out).all(axis=-1, keepdims=True)  # (..., rows, 1)
    np.divide(e, sums, out=e, where=redo)
    np.copyto(out, np.matmul(e, v), where=redo)


def _normalize_and_mix(
    z: np.ndarray,
    v: np.ndarray,
    out: np.ndarray,
    valid: np.ndarray,
    normalizer: str,
    alpha: float | None,
    *,
    keep_weights: bool,
) -> None:
    """From the masked scores ``z`` (..., kv heads, rows, S; masked = -inf) to ``out = A v``: the step both
    forward paths share. ``valid`` counts each row's valid keys (``z``'s shape without S). With
    ``keep_weights`` the weights A are left in ``z``; else softmax normalizes the (rows, Ev) output
    instead of the (rows, S) weights. A leading batch axis is normalized one batch at a time, as the
    chunked path does: the bisection's row blocks depend on the rows they hold.
    """
    if normalizer == "softmax":
        sums, dead = _exp_shifted(z)
        check_live_rows(dead, valid, z.dtype)
        if not np.isfinite(sums).all():  # a live row's largest score is +inf or NaN: exp(z - max) is NaN
            raise overflow_error(z.dtype)
        if keep_weights:
            z /= sums
            np.matmul(z, v, out=out)
        else:
            _mix_then_normalize(z, v, out, sums)
        return
    row_max = z.max(axis=-1)
    check_live_rows(row_max == -np.inf, valid, z.dtype)
    if np.isnan(row_max).any() or (row_max == np.inf).any():  # the sorting normalizers would give NaN weights
        raise overflow_error(z.dtype)
    if z.ndim == 3:
        a = normalizers.normalize(z, normalizer, alpha=alpha)
    elif z.shape[0] == 1:
        a = normalizers.normalize(z[0], normalizer, alpha=alpha)[None]
    else:
        a = np.empty_like(z)
        for b in range(z.shape[0]):
            normalizers.normalize(z[b], normalizer, alpha=alpha, out=a[b])
    if keep_weights:
        z[...] = a
    np.matmul(a, v, out=out)


def forward_small(
    p: Prepared,
    normalizer: str,
    alpha: float | None,
    output: np.ndarray,
    weights: np.ndarray | None,
    scores: np.ndarray | None,
) -> None:
    """Fill ``output`` (and ``weights``, ``scores``) for the whole task at once.

    The same operations in the same order as :func:`forward_chunked` on one chunk per batch, on arrays
    with a leading batch axis: element-wise steps and row reductions give the same numbers for every
    row, and ``matmul`` of a stack runs the same GEMM on each (B, Hkv) matrix. So the results are
    bit-identical to the chunked path (``tests/core/test_attention_fast.py``). The sort-based and
    bisection normalizers get one batch at a time, as there: the bisection's row blocks depend on
    the rows they hold.
    """
    d = p.dims
    B, Hkv, GL, S = d.B, d.Hkv, d.group * d.L, d.S
    dtype = output.dtype
    out = output.reshape(B, Hkv, GL, d.Ev)
    z = np.empty((B, Hkv, GL, S), dtype=dtype) if weights is None else weights.reshape(B, Hkv, GL, S)
    z5 = z.reshape(B, Hkv, d.group, d.L, S)
    drop5 = p.drop5
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        if normalizer == "relu":  # as _relu_chunk: float64 scores, no temperature
            a = _relu_weights(p, p.q5, p.k, p.raw_bias5, drop5, None if scores is None else scores.reshape(z.shape))
            _mix_relu(a, z, p.v, out, keep_weights=weights is not None)
            return
        np.matmul((p.q5 * p.factor).reshape(B, Hkv, GL, d.E), p.k.transpose(0, 1, 3, 2), out=z)
        if p.bias5 is not None:
            z5 += p.bias5
        if scores is not None:
            check_scores_finite(z5, None if drop5 is None else ~drop5, dtype)
        if drop5 is not None:
            np.copyto(z5, -np.inf, where=drop5)
        if scores is not None:
            scores.reshape(z.shape)[...] = z
        _normalize_and_mix(
            z, p.v, out, p.valid_keys.reshape(B, Hkv, GL), normalizer, alpha, keep_weights=weights is not None
        )


def forward_chunked(
    p: Prepared,
    params: AttentionParams,
    output: np.ndarray,
    weights: np.ndarray | None,
    scores: np.ndarray | None,
    executor: Executor | None,
    workers: int,
) -> None:
    """Fill the results chunk by chunk (:func:`.chunks.run_chunks`), on ``executor`` when the task is large enough."""
    d = p.dims
    output5 = split_heads(output, d)
    weights5 = None if weights is None else split_heads(weights, d)
    scores5 = None if scores is None else split_heads(scores, d)

    def work(c: Chunk) -> None:
        _forward_chunk(p, c, params.normalizer, params.alpha, output5, weights5, scores5)

    run_chunks(d, work, executor, workers)


def run_attention(task: AttentionTask, *, executor: Executor | None = None, workers: int = 1) -> AttentionResult:
    """Run attention on numpy; the reference implementation of docs/concepts/contract.md.

    A task of at most :data:`FAST_PATH_SCORES` scores runs in one pass
    (:func:`forward_small`, bit-identical to the chunked path). Larger ones are
    split into chunks of query rows (at most :data:`.chunks.CHUNK_ELEMENTS`
    scores each) so that peak memory beyond the result is one chunk per
    thread. With an ``executor`` of ``workers`` threads (BLAS then best limited
    to one thread, as :class:`~service.engines.numpy_engine.NumpyEngine` does),
    requests of at least :data:`.chunks.PARALLEL_MIN_ELEMENTS` scores are cut into at
    least ``workers`` chunks that run in parallel.

    Raises :class:`InvalidInput` for inputs the contract rejects and
    :class:`NumericalError` when a result would not be finite (float32 scores
    that overflow: retry with float64).
    """
    params = task.params
    p = prepare(task.inputs, params, task.dtype)
    d = p.dims
    dtype = p.q.dtype
    output = np.empty((d.B, d.Hq, d.L, d.Ev), dtype=dtype)
    weights = np.empty(d.weights_shape, dtype=dtype) if task.need_weights else None
    scores = np.empty(d.weights_shape, dtype=dtype) if task.need_scores else None
    total = d.B * d.Hq * d.L * d.S
    if total <= FAST_PATH_SCORES:
        forward_small(p, params.normalizer, params.alpha, output, weights, scores)
    else:
        forward_chunked(p, params, output, weights, scores, executor, workers)
    if not np.isfinite(output).all():
        if np.isnan(output).any():  # from scores that overflowed (relu's +inf; the others are refused before)
            raise overflow_error(dtype, "the attention output is not finite: the scores")
        raise output_overflow_error(dtype)
    rank = task.inputs.query.ndim
    lead = task.inputs.query.shape[:-1]
    return AttentionResult(
        output=output.reshape(lead + (d.Ev,)) if rank < 4 else output,
        weights=None if weights is None else weights.reshape(lead + (d.S,)),
        scores=None if scores is None else scores.reshape(lead + (d.S,)),
        valid_keys=p.valid_keys,
    )


def attention(
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    *,
    mask: np.ndarray | None = None,
    key_lengths: np.ndarray | None = None,
    params: AttentionParams | None = None,
    dtype: np.dtype | type = np.float32,
    need_weights: bool = True,
    need_scores: bool = False,
) -> AttentionResult:
    """Library entry point: attention on numpy arrays (see :func:`run_attention`)."""
    task = AttentionTask(
        inputs=AttentionInputs(query=query, key=key, value=value, mask=mask, key_lengths=key_lengths),
        params=params or AttentionParams(),
        dtype=np.dtype(dtype),
        need_weights=need_weights,
        need_scores=need_scores,
    )
    return run_attention(task)
