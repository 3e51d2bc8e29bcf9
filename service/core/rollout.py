"""Attention rollout across layers (Abnar and Zuidema 2020) and its gradient-weighted form (Chefer et al. 2021).

The problem: a transformer's attention weights describe one layer each, but information flows through every
layer, and through the residual connections beside them. Rollout estimates how much each output position draws
on each input token by multiplying the layers' attention, each mixed with the identity for the residual path.

Given the weights of ``layers`` layers, first layer first, ``weights[l]`` of shape ``[B, H, L, L]`` (one
distribution over the keys per query row: the contract's weights, a fully masked row all zeros), per layer and
batch entry:

1. **Head fusion** (``head_fusion``): the mean, the maximum or the minimum over the heads, ``A_fused [L, L]``.
   With ``gradients`` (the gradient of a loss with respect to the weights, the same shape), the fused matrix is
   Chefer et al.'s instead: ``mean over heads of relu(grad * A)``, the positive part taken before the mean (their
   rule 5, "Generic Attention-model Explainability for Interpreting Bi-Modal and Encoder-Decoder Transformers",
   ICCV 2021, arXiv:2103.15679; ``avg_heads`` in hila-chefer/Transformer-MM-Explainability). jacobgil/vit-explain's
   ``grad_rollout`` takes the mean before the relu and fuses batch 0 alone; this follows the paper, every entry.
2. **Discard** (``discard_ratio``): the lowest ``int(L * L * discard_ratio)`` entries of ``A_fused`` set to 0, as
   vit-explain's ``rollout`` does it (``topk(largest=False)`` over the flattened matrix), the first token's own
   weight ``[0, 0]`` never among them (when it is one of the lowest, one entry fewer is discarded: vit-explain
   drops index 0 from the selection rather than taking the next). Ties at the boundary go to the lower flat index
   (torch's ``topk`` leaves their order open). vit-explain discards in batch entry 0 only; this does it in every
   entry (and also in the gradient-weighted form, where vit-explain's ``grad_rollout`` does not protect ``[0, 0]``).
3. **Residual** (``residual``, default 0.5): ``A_hat = residual * I + (1 - residual) * A_fused``, then each row
   divided by its sum (Abnar and Zuidema, "Quantifying Attention Flow in Transformers", ACL 2020, section 3: the
   identity for the residual connection, re-normalised). vit-explain divides by ``a.sum(dim=-1)`` without
   ``keepdim``, which broadcasts the row sums along the last axis: it divides column ``j`` by row ``j``'s sum.
   This follows the paper (rows). An all-zero row of ``A_fused`` (a fully masked query in every head, a row the
   discard emptied, or no positive ``grad * A``) becomes the identity row ``e_i``; with ``residual`` 0 it stays
   all zero (there is nothing to divide).
4. **Product**: ``rollout = A_hat[last] @ ... @ A_hat[first]``, ``[B, L, L]``; row ``i`` is how much output
   position ``i`` draws on each input token. With ``rows``, only those rows, computed from the left
   (``e_rows @ A_hat[last] @ ...``): ``R * L^2`` per layer instead of ``L^3``.
5. **Top keys** (``top_k``, optional): only the ``k`` largest entries of each answered row and their key indices
   (:func:`top_keys`), ``[B, R, k]`` each, largest first, ties to the lower key index, so an answer over long
   sequences stays ``k`` numbers a row instead of ``L``.

Checks (refusals name the field, and the layer, batch, head and row): the weights are finite and non-negative and
each row sums to 1 within the tolerance or to exactly 0 (a fully masked row), unless ``renormalize`` (then each
row is divided by its sum; all-zero rows stay zero). The tolerance is that of the coarser of the weights' dtype
as sent and the compute precision (:data:`ROW_SUM_TOLERANCE`: 1e-3 for float16, 1e-5 for float32, 1e-9 for
float64); the row sums are accumulated in float32 for float16 and float32 weights (their error, about
``log2(L) * 6e-8``, is far inside the tolerance) and in float64 for float64 ones and with ``renormalize``.
Gradients are finite, of any sign.

The fusion and the products run in float64 whatever the weights' dtype; the caller rounds the answer to its
precision.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from service.core.errors import InvalidInput

HEAD_FUSIONS = ("mean", "max", "min")
ROW_SUM_TOLERANCE: dict[np.dtype, float] = {
    np.dtype(np.float16): 1e-3,
    np.dtype(np.float32): 1e-5,
    np.dtype(np.float64): 1e-9,
}
"""How far from 1 a row of weights may sum, by dtype (:func:`row_sum_tolerance` takes the coarser of two)."""
PARALLEL_MIN_ELEMENTS = 1 << 16
"""Below this many weights in all, handing layers and row blocks to threads costs more than it saves."""

T = TypeVar("T")
U = TypeVar("U")


@dataclass(frozen=True, slots=True)
class RolloutParams:
    """The options of one rollout (the module docstring's steps)."""

    head_fusion: str = "mean"
    residual: float = 0.5
    discard_ratio: float = 0.0
    renormalize: bool = False
    tolerance: float = ROW_SUM_TOLERANCE[np.dtype(np.float32)]
    """How far from 1 a row may sum (:func:`row_sum_tolerance`)."""


def row_sum_tolerance(weights_dtype: np.dtype, precision: np.dtype) -> float:
    """The tolerance of the coarser of the weights' dtype as sent and the compute precision: float32 weights
    computed in float64 are held to float32's 1e-5, float64 weights (JSON lists) computed in float32 too.
    """
    return max(ROW_SUM_TOLERANCE[np.dtype(weights_dtype)], ROW_SUM_TOLERANCE[np.dtype(precision)])


def check_params(params: RolloutParams, with_gradients: bool) -> None:
    """Refuse options outside their ranges, and a head fusion the gradient-weighted form does not have."""
    if params.head_fusion not in HEAD_FUSIONS:
        raise InvalidInput(
            f"head_fusion {params.head_fusion!r} is not one of {', '.join(HEAD_FUSIONS)}", ("head_fusion",)
        )
    if with_gradients and params.head_fusion != "mean":
        raise InvalidInput(
            f"head_fusion {params.head_fusion!r} has no gradient-weighted form: with gradients the heads are fused "
            "as the mean of relu(grad * A) (Chefer et al. 2021); leave head_fusion out or send 'mean'",
            ("head_fusion",),
        )
    if not 0.0 <= params.residual <= 1.0:
        raise InvalidInput(f"residual {params.residual} is outside [0, 1]", ("residual",))
    if not 0.0 <= params.discard_ratio <= 1.0:
        raise InvalidInput(f"discard_ratio {params.discard_ratio} is outside [0, 1]", ("discard_ratio",))


def resolve_rows(rows: Sequence[int] | np.ndarray, length: int) -> np.ndarray:
    """``rows`` as non-negative int64 indices into ``length`` query rows (``-1`` is the last); each in range,
    none twice, at least one.
    """
    values = [int(r) for r in (rows.reshape(-1).tolist() if isinstance(rows, np.ndarray) else rows)]
    if not values:
        raise InvalidInput("rows is empty; leave it out for every row", ("rows",))
    seen: dict[int, int] = {}
    for i, r in enumerate(values):
        if not -length <= r < length:
            raise InvalidInput(
                f"rows[{i}] = {r} is out of range: the weights have L = {length} rows, "
                f"indices {-length} to {length - 1} (negative from the end)",
                ("rows", i),
            )
        index = r % length
        if index in seen:
            raise InvalidInput(f"rows[{i}] = {r} is row {index} again (rows[{seen[index]}])", ("rows", i))
        seen[index] = i
    return np.array(list(seen), dtype=np.int64)


def check_top_k(top_k: int, length: int) -> None:
    """``top_k`` keys per row: at least 1, at most the ``length`` keys of a row."""
    if not 1 <= top_k <= length:
        raise InvalidInput(
            f"top_k {top_k} is outside [1, {length}]: the weights have L = {length} keys per row", ("top_k",)
        )


def top_keys(rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` largest entries of each row of ``rows`` ``[..., L]`` and their indices (int64), ``[..., k]`` each,
    largest first; equal entries in order of their index (a stable sort of the negated rows), so the answer is the
    same on every machine.
    """
    order = np.argsort(-rows, axis=-1, kind="stable")[..., :k]
    return order.astype(np.int64, copy=False), np.take_along_axis(rows, order, axis=-1)


@dataclass(frozen=True, slots=True)
class Head:
    """Where a head's matrix ``[L, L]`` sits in the stack: its layer, batch entry and head."""

    layer: int
    batch: int
    head: int

    def refuse(self, name: str, index: tuple[int, ...], what: str) -> InvalidInput:
        """The refusal of ``name``'s element ``(i, j)`` or row ``(i,)`` of this head: ``name[l, b, h, i(, j)]
        (layer l, batch b, head h, row i) <what>``, located at that index.
        """
        where = (self.layer, self.batch, self.head, *index)
        text = f"{name}[{', '.join(map(str, where))}]"
        place = f"(layer {self.layer}, batch {self.batch}, head {self.head}, row {index[0]})"
        return InvalidInput(f"{text} {place} {what}", (name, *where))


def _first(bad: np.ndarray) -> tuple[int, ...]:
    return tuple(int(i) for i in np.unravel_index(int(np.argmax(bad.reshape(-1))), bad.shape))


def check_head(x: np.ndarray, where: Head, params: RolloutParams) -> np.ndarray | None:
    """Refuse one head's weights ``[L, L]`` that cannot be attention weights (module docstring); with
    ``renormalize``, their row sums in float64 (else None).
    """
    lowest = x.min()
    if not lowest >= 0:  # a negative value, or a NaN (min propagates it)
        index = _first(~(x >= 0))
        value = x[index]
        what = f"is {value}; values must be finite" if not np.isfinite(value) else f"= {value} is negative"
        raise where.refuse("weights", index, f"{what}: attention weights are >= 0")
    wide = params.renormalize or x.dtype == np.float64
    sums: np.ndarray = np.add.reduce(x, axis=-1, dtype=np.float64 if wide else np.float32)
    finite = np.isfinite(sums)
    if not finite.all():
        row = int(np.argmax(~finite))
        inf = ~np.isfinite(x[row])
        if inf.any():
            index = (row, int(np.argmax(inf)))
            raise where.refuse("weights", index, f"is {x[index]}; values must be finite")
        if params.renormalize:
            raise where.refuse("weights", (row,), "sums beyond the largest float64: it cannot be renormalized")
    if params.renormalize:
        return sums
    bad = ~((np.abs(sums - 1) <= params.tolerance) | (sums == 0))
    if bad.any():
        row = int(np.argmax(bad))
        raise where.refuse(
            "weights",
            (row,),
            f"sums to {float(sums[row]):.9g}, neither 1 (within {params.tolerance:g}) nor 0 (a fully masked row): "
            "not attention weights; renormalize true divides each row by its sum",
        )
    return None


def check_gradients(g: np.ndarray, where: Head) -> None:
    """Refuse a NaN or an infinity among one head's gradients ``[L, L]`` (any sign is allowed)."""
    if not (np.isfinite(g.min()) and np.isfinite(g.max())):
        index = _first(~np.isfinite(g))
        raise where.refuse("gradients", index, f"is {g[index]}; values must be finite")


def layer_fused(w: np.ndarray, g: np.ndarray | None, layer: int, params: RolloutParams) -> np.ndarray:
    """Layer ``layer``'s weights ``[B, H, L, L]`` (and gradients) checked and fused over the heads into a new
    float64 ``[B, L, L]`` (module docstring, step 1), one head at a time: each head's matrix is read from memory
    once for its checks and its share of the fusion.
    """
    batch, heads, length, _ = w.shape
    fused = np.zeros((batch, length, length), dtype=np.float64)
    for b in range(batch):
        acc = fused[b]
        for h in range(heads):
            where = Head(layer, b, h)
            x = w[b, h]
            sums = check_head(x, where, params)
            if sums is not None:  # renormalize: each row divided by its sum, all-zero rows left zero
                scale = np.divide(1.0, sums, out=np.zeros_like(sums), where=sums > 0)
                x = np.multiply(x, scale[:, None], dtype=np.float64)
            if g is not None:
                check_gradients(g[b, h], where)
                product = np.multiply(g[b, h], x, dtype=np.float64)
                acc += np.maximum(product, 0.0, out=product)
            elif params.head_fusion == "mean" or h == 0:
                acc += x
            elif params.head_fusion == "max":
                np.maximum(acc, x, out=acc)
            else:
                np.minimum(acc, x, out=acc)
    if g is not None or params.head_fusion == "mean":
        fused /= heads
    return fused


def discard_lowest(fused: np.ndarray, ratio: float) -> None:
    """In place, per batch entry: the lowest ``int(L * L * ratio)`` entries set to 0, never ``[0, 0]``; ties at
    the boundary go to the lower flat index (module docstring, step 2).
    """
    size = fused.shape[-1] * fused.shape[-1]
    k = int(size * ratio)
    if k == 0:
        return
    for b in range(fused.shape[0]):
        flat = fused[b].reshape(-1)  # a view: fused is C-contiguous
        if k >= size:
            chosen = np.ones(size, dtype=bool)
        else:
            boundary = np.partition(flat, k - 1)[k - 1]
            chosen = flat < boundary
            ties = np.flatnonzero(flat == boundary)[: k - int(np.count_nonzero(chosen))]
            chosen[ties] = True
        chosen[0] = False
        flat[chosen] = 0.0


def with_residual(fused: np.ndarray, residual: float) -> np.ndarray:
    """In place: ``residual * I + (1 - residual) * fused``, each row divided by its sum (rows summing to 0 stay)."""
    length = fused.shape[-1]
    fused *= 1.0 - residual
    fused.reshape(fused.shape[0], -1)[:, :: length + 1] += residual  # every entry's diagonal (fused is contiguous)
    sums = fused.sum(axis=-1, keepdims=True)
    np.divide(fused, sums, out=fused, where=sums > 0)
    return fused


def layer_matrix(w: np.ndarray, g: np.ndarray | None, layer: int, params: RolloutParams) -> np.ndarray:
    """Layer ``layer``'s ``A_hat`` ``[B, L, L]`` in float64, its weights (and gradients) checked first."""
    fused = layer_fused(w, g, layer, params)
    discard_lowest(fused, params.discard_ratio)
    return with_residual(fused, params.residual)


def _map(fn: Callable[[T], U], items: Sequence[T], executor: Executor | None, parallel: bool) -> list[U]:
    """``fn`` over ``items`` in order, on ``executor`` when ``parallel`` (the first item's error is raised first)."""
    if parallel and executor is not None and len(items) > 1:
        return list(executor.map(fn, items))
    return [fn(item) for item in items]


def row_blocks(count: int, blocks: int) -> list[slice]:
    """``count`` rows cut into ``blocks`` contiguous slices of nearly equal size (none empty)."""
    blocks = max(1, min(blocks, count))
    edges = [count * i // blocks for i in range(blocks + 1)]
    return [slice(edges[i], edges[i + 1]) for i in range(blocks)]


def rollout(
    weights: np.ndarray,
    gradients: np.ndarray | None,
    params: RolloutParams,
    rows: np.ndarray | None = None,
    *,
    executor: Executor | None = None,
    workers: int = 1,
) -> np.ndarray:
    """The rollout ``[B, L, L]`` of ``weights`` ``[layers, B, H, L, L]``, or its ``rows`` ``[B, R, L]`` (indices
    from :func:`resolve_rows`), in float64 (module docstring). With an ``executor`` of ``workers`` threads, the
    layers are checked and fused in parallel, and the products run as independent chains of row blocks.
    """
    check_params(params, gradients is not None)
    layers, batch, _, length, _ = weights.shape
    parallel = workers > 1 and weights.size >= PARALLEL_MIN_ELEMENTS

    def prepare(layer: int) -> np.ndarray:
        return layer_matrix(weights[layer], None if gradients is None else gradients[layer], layer, params)

    hats = _map(prepare, range(layers), executor, parallel)
    picked = np.arange(length) if rows is None else rows
    blocks = -(-workers // batch) if parallel else 1
    tasks = [(b, block) for b in range(batch) for block in row_blocks(len(picked), blocks)]

    def chain(task: tuple[int, slice]) -> np.ndarray:
        b, block = task
        index = picked[block]
        acc: np.ndarray = hats[-1][b][index] if rows is not None else hats[-1][b][block]
        for layer in range(layers - 2, -1, -1):
            acc = acc @ hats[layer][b]
        return acc

    out = np.empty((batch, len(picked), length), dtype=np.float64)
    for (b, block), part in zip(tasks, _map(chain, tasks, executor, parallel), strict=True):
        out[b, block] = part
    return out
