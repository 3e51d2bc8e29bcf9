"""Checks on decoded arrays, whatever the wire form they came in: size limits, finiteness, the cast to the
compute dtype. Each failure is an :class:`~service.core.errors.InvalidInput` naming the field and the
element's index (``query[0, 1]``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from service.core.errors import InvalidInput


@dataclass(frozen=True, slots=True)
class TensorLimits:
    """Size limits of one input tensor (``ATTN_MAX_RANK``, ``ATTN_MAX_DIM``, ``ATTN_MAX_TENSOR_ELEMENTS``)."""

    max_rank: int = 4
    max_dim: int = 16384
    max_elements: int = 1 << 24


STACK_RANK = 5
"""Rank of a stack of layers' weights ``[layers, B, H, L, L]`` (the rollout's input)."""


def stack_limits(limits: TensorLimits) -> TensorLimits:
    """Limits of a stack of layers' weights: rank up to :data:`STACK_RANK`, each layer within ``limits``'s element
    count (checked by the operation, which names the layer's shape), the layers at most ``limits.max_dim``.
    """
    return TensorLimits(max_rank=STACK_RANK, max_dim=limits.max_dim, max_elements=limits.max_elements * limits.max_dim)


def check_shape(shape: tuple[int, ...], name: str, limits: TensorLimits, min_rank: int) -> None:
    """Refuse a shape outside the limits: rank, any one dimension (each >= 1), element count."""
    if len(shape) > limits.max_rank or len(shape) < min_rank:
        raise InvalidInput(f"{name} has rank {len(shape)}; ranks {min_rank} to {limits.max_rank} are accepted", (name,))
    for axis, size in enumerate(shape):
        if size < 1:
            raise InvalidInput(
                f"{name} has size {size} at axis {axis}; every dimension must be >= 1", (name, "shape", axis)
            )
        if size > limits.max_dim:
            raise InvalidInput(
                f"{name} has size {size} at axis {axis}, above the limit of {limits.max_dim}", (name, "shape", axis)
            )
    count = math.prod(shape)
    if count > limits.max_elements:
        raise InvalidInput(f"{name} has {count} elements, above the limit of {limits.max_elements}", (name, "shape"))


def first_non_finite(arr: np.ndarray) -> tuple[int, ...] | None:
    """Index of the first NaN or infinity in C order, or None if all are finite."""
    if arr.dtype.kind != "f":
        return None
    bad = ~np.isfinite(arr)
    if not bad.any():
        return None
    flat = int(np.argmax(bad.reshape(-1)))
    return tuple(int(i) for i in np.unravel_index(flat, arr.shape))


def index_text(index: tuple[int, ...]) -> str:
    """``[0, 1]``: an element's index as messages write it."""
    return f"[{', '.join(map(str, index))}]"


def check_finite(arr: np.ndarray, name: str, *, allow_neg_inf: bool = False) -> None:
    """Reject NaN and infinities, naming the first offending element's index."""
    if arr.dtype.kind != "f":
        return
    probe = arr
    if allow_neg_inf:
        probe = np.where(np.isneginf(arr), 0, arr)
    idx = first_non_finite(probe)
    if idx is not None:
        raise InvalidInput(
            f"{name}[{', '.join(map(str, idx))}] is {arr[idx]}; values must be finite"
            + (" (or -inf)" if allow_neg_inf else ""),
            (name, *idx),
        )


def cast_checked(arr: np.ndarray, dtype: np.dtype, name: str) -> np.ndarray:
    """Cast to the compute dtype, rejecting values the cast turns infinite (float32 overflow).

    A value that was already NaN or infinite is named as such (values must be
    finite), not as an overflow; the hint to use float64 is given only where
    it helps, i.e. for a float32 computation of finite float64 input.
    """
    if arr.dtype == dtype:
        return arr
    with np.errstate(over="ignore", invalid="ignore"):
        out = np.asarray(arr, dtype=dtype)
    if arr.dtype.kind in "fiu":
        idx = first_non_finite(out)
        if idx is not None:
            source = arr[idx]
            if arr.dtype.kind == "f" and not np.isfinite(source):
                raise InvalidInput(f"{name}{index_text(idx)} is {source}; values must be finite", (name, *idx))
            target = np.dtype(dtype)
            hint = "; use precision float64" if target.itemsize < 8 else ""
            raise InvalidInput(
                f"{name}{index_text(idx)} = {source} overflows {target.name} "
                f"(largest {float(np.finfo(target).max):g}){hint}",
                (name, *idx),
            )
    return out


_all = np.logical_and.reduce
PYTHON_CHECK_MAX = 64
"""Up to this many values, a tensor's values are checked in Python (:func:`finite_as`, and the /v2 datatype's
range): numpy's per-call cost is most of a tiny tensor's time (an ``errstate`` block alone costs more than the
cast)."""
FLOAT_MAX = {np.dtype(t): float(np.finfo(t).max) for t in (np.float16, np.float32, np.float64)}
"""The largest finite value of each float dtype."""


def _finite_fits(arr: np.ndarray, dtype: np.dtype) -> bool:
    """True when every value of the float array ``arr`` is finite and stays finite in ``dtype`` (False may also
    mean only that the quick check cannot tell: a sum that overflows float64).
    """
    values: list[float] = arr.ravel().tolist()
    total = sum(values)
    if total - total != 0:  # a NaN or an infinity among the values makes the sum one
        return False
    if dtype.itemsize >= arr.dtype.itemsize:
        return True
    largest = FLOAT_MAX[dtype]  # no finite value of magnitude <= largest rounds to an infinity
    return max(values) <= largest and min(values) >= -largest


def finite_as(arr: np.ndarray, dtype: np.dtype, name: str) -> np.ndarray:
    """``arr`` in the compute ``dtype`` with every value finite: :func:`cast_checked` and :func:`check_finite`
    in one pass (one check of the result; the index and the cause are looked for only when it fails).
    """
    if 0 < arr.size <= PYTHON_CHECK_MAX and arr.dtype.kind == "f" and dtype in FLOAT_MAX and _finite_fits(arr, dtype):
        return arr if arr.dtype == dtype else np.asarray(arr, dtype=dtype)
    if arr.dtype == dtype:
        out = arr
    else:
        with np.errstate(over="ignore", invalid="ignore"):
            out = np.asarray(arr, dtype=dtype)
    if out.dtype.kind != "f" or _all(np.isfinite(out), axis=None):  # ndarray.all() adds a Python-level call
        return out
    cast_checked(arr, dtype, name)  # names a value the cast made infinite, or a NaN/infinity sent as such
    check_finite(out, name)
    raise AssertionError("unreachable: a non-finite value was found above")  # pragma: no cover


def float_mask_as(mask: np.ndarray | None, dtype: np.dtype) -> np.ndarray | None:
    """A float mask in the compute dtype, finite or -inf (a masked position); a bool mask as it is.

    A finite value the cast turns infinite (``-1e39`` in float32) is refused, named with its value: taken as
    ``-inf`` it would mask its position, and a row of them would become a fully masked row (zeros) where the
    contract's arithmetic gives weights.
    """
    if mask is None or mask.dtype == bool:
        return mask
    with np.errstate(over="ignore"):
        out = np.asarray(mask, dtype=dtype)
    if out is not mask and out.dtype.kind == "f" and not _all(np.isfinite(out), axis=None):
        overflowed = np.isfinite(mask) & ~np.isfinite(out)
        if overflowed.any():
            cast_checked(np.where(overflowed, mask, 0), dtype, "mask")  # names the first value the cast overflowed
    check_finite(out, "mask", allow_neg_inf=True)
    return out
