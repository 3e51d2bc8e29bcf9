"""What JSON ``data`` of the Open Inference Protocol must satisfy beyond its values' types: its nesting (the
tensor's own or flat, nothing between) and, for FP16 and FP32, a range that rounds to a finite value.
"""

from __future__ import annotations

import math

import numpy as np

from service.dataplane.errors import invalid
from service.dataplane.inference import DATATYPES
from service.dataplane.tensors import FLOAT_MAX, PYTHON_CHECK_MAX, index_text


def check_nesting(found: tuple[int, ...], shape: tuple[int, ...], name: str) -> None:
    """``data`` holding the declared number of values is the tensor's own nested form or flat (row-major), as the
    protocol allows: any other nesting (the transpose of a matrix, an extra level) is refused rather than read again
    in row-major order. ``found`` is the nesting already read with the values (numpy's or the body scan's shape).
    """
    if len(found) == 1 or found == shape:  # (no empty tensor gets here: every dimension is >= 1)
        return
    raise invalid(
        f"input {name!r}: data is nested as {list(found)}, but the declared shape is {list(shape)}; send data "
        f"nested exactly as the shape, or flat in row-major order"
    )


def rounding_limit(dtype: np.dtype) -> float:
    """The magnitude from which a float64 rounds to an infinity in the narrower IEEE ``dtype``: halfway between
    its largest value and the next power of two, 2**maxexp - 2**(maxexp - nmant - 2) (a tie rounds to the even
    neighbour, the infinity). 2**128 - 2**103 for float32, 65520 for float16: exact in a float64.
    """
    info = np.finfo(dtype)
    return math.ldexp(1.0, info.maxexp) - math.ldexp(1.0, info.maxexp - info.nmant - 2)


ROUNDS_TO_FINITE = {np.dtype(t): rounding_limit(np.dtype(t)) for t in (np.float16, np.float32)}
"""A float64 of smaller magnitude than this rounds to a finite value of the dtype (at most its largest): -3.4028235e38,
how numpy, Go and Rust print float32's lowest value, is float32's lowest value, not an overflow."""


def check_fits(arr: np.ndarray, datatype: str, dtype: np.dtype, name: str) -> None:
    """A number that the declared float datatype cannot hold is refused by element, with the protocol's remedy (the
    wider datatype), as /v1 refuses a value beyond its declared dtype.
    """
    if dtype.itemsize >= 8 or arr.size == 0:
        return
    limit = ROUNDS_TO_FINITE[dtype]  # FP16 or FP32 here: every float datatype narrower than FP64
    # The largest magnitude first (a tiny tensor's in Python: numpy's per-call cost is most of the time there);
    # JSON holds no NaN, and a NaN peak takes the element-wise path anyway.
    peak = max(map(abs, arr.ravel().tolist())) if arr.size <= PYTHON_CHECK_MAX else float(np.abs(arr).max())
    if peak < limit:
        return
    with np.errstate(invalid="ignore"):
        over = np.abs(arr) >= limit
    if not over.any():
        return
    idx = tuple(int(i) for i in np.unravel_index(int(np.flatnonzero(over)[0]), arr.shape))
    wider = " or ".join(t for t in ("FP32", "FP64") if np.dtype(DATATYPES[t]).itemsize > dtype.itemsize)
    # The value as sent (shortest round-trip form): 3.4028236e+38 overflows FP32, 3.4028235e+38 does not.
    raise invalid(
        f"input {name!r}: data{index_text(idx)} = {arr[idx].item()!r} overflows {datatype}, the declared datatype "
        f"(largest {FLOAT_MAX[dtype]:g}); send the input as {wider}"
    )
