"""Shared pieces of the normalizers: dtypes, row maxima, safe denominators, and rows in bounded chunks."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

# Rows are processed in chunks of about this many elements by the sort-based and
# bisection normalizers, so float64 temporaries stay a few MiB whatever the input.
ROW_CHUNK_ELEMENTS = 1 << 17


def as_float(z: np.ndarray) -> np.ndarray:
    """``z`` as an array of a floating dtype (float64 for non-floating input)."""
    z = np.asarray(z)
    if not np.issubdtype(z.dtype, np.floating):
        z = z.astype(np.float64)
    return z


def row_max(z: np.ndarray, axis: int) -> np.ndarray:
    """Row max with keepdims; rows with no finite entry (max ``-inf``) get 0."""
    m: np.ndarray = np.max(z, axis=axis, keepdims=True)
    m[m == -np.inf] = 0
    return m


def safe_denominator(s: np.ndarray) -> np.ndarray:
    """Replace zero row sums (fully masked rows) by 1, in place, so 0/1 = 0."""
    s[s == 0] = 1
    return s


def apply_rows(z: np.ndarray, axis: int, fn: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """Apply ``fn`` (2-D chunk of rows in z's dtype -> float64 weights) along ``axis``."""
    z = as_float(z)
    if z.size == 0:
        return np.zeros_like(z)
    zm = np.moveaxis(z, axis, -1)
    shape = zm.shape
    d = shape[-1]
    rows = zm.reshape(-1, d)
    out = np.empty(rows.shape, dtype=z.dtype)
    step = max(1, ROW_CHUNK_ELEMENTS // d)
    # z - max may overflow to -inf (e.g. -1e308 - 1e308): such an entry is far below the support anyway.
    with np.errstate(under="ignore", over="ignore"):
        for start in range(0, rows.shape[0], step):
            out[start : start + step] = fn(rows[start : start + step])
    return np.moveaxis(out.reshape(shape), -1, axis)


def sorted_candidates(chunk: np.ndarray, scale: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Shared set-up of the sort-based and bisection kernels for a 2-D chunk of rows.

    Returns ``x = scale * (chunk - rowmax)`` as a fresh float64 array (so the
    row max of x is 0, or x is all ``-inf`` for a fully masked row), the
    candidates ``x > -1`` of each row sorted descending, truncated to the
    largest candidate count in the chunk (later columns padded with 0), and the
    candidate counts ``(r,)``. For sparsemax (scale 1), entmax15 (scale 1/2)
    and alpha-entmax (scale alpha - 1) the threshold tau is >= -1, so entries
    with ``x <= -1`` are never in the support and can be dropped exactly. A
    count of 0 means the row is fully masked.
    """
    x = chunk.astype(np.float64)  # always a fresh copy: safe to modify in place
    m = row_max(x, axis=1)
    x -= m
    if scale != 1.0:
        x *= scale
    srt = np.sort(chunk, axis=1)[:, ::-1].astype(np.float64)
    srt -= m
    if scale != 1.0:
        srt *= scale
    cand = srt > -1.0
    n_cand = np.count_nonzero(cand, axis=1)
    width = max(int(n_cand.max()), 1)
    srt = srt[:, :width]
    np.copyto(srt, 0.0, where=~cand[:, :width])
    return x, srt, n_cand
