"""The exact sort-based normalizers: sparsemax (alpha = 2) and 1.5-entmax (docs/concepts/normalizers.md)."""

from __future__ import annotations

import numpy as np

from service.core.normalizers.rows import apply_rows, sorted_candidates


def _sparsemax_rows(chunk: np.ndarray) -> np.ndarray:
    x, srt, n_cand = sorted_candidates(chunk, 1.0)
    k = np.arange(1, srt.shape[1] + 1, dtype=np.float64)
    c = np.cumsum(srt, axis=1)
    c -= 1.0
    support = (k * srt > c) & (k <= n_cand[:, None])
    n_support = np.count_nonzero(support, axis=1)
    idx = np.maximum(n_support, 1) - 1
    tau = np.take_along_axis(c, idx[:, None], axis=1) / (idx[:, None] + 1.0)
    tau[n_support == 0] = 0.0
    x -= tau
    np.maximum(x, 0.0, out=x)
    return x


def sparsemax(z: np.ndarray, axis: int = -1) -> np.ndarray:
    """Sparsemax (Martins & Astudillo 2016), exact and sort-based.

    Solves ``argmin_{p in Delta} ||p - z||^2``, i.e.
    ``argmax_{p in Delta} <p, z> - 1/2 ||p||^2``; the solution is
    ``p = max(z - tau, 0)`` with ``tau = (sum_{j<=K} z_(j) - 1) / K`` and
    ``K = #{k : 1 + k z_(k) > sum_{j<=k} z_(j)}`` over z sorted descending.
    Equals entmax with alpha = 2.
    """
    return apply_rows(z, axis, _sparsemax_rows)


def _entmax15_rows(chunk: np.ndarray) -> np.ndarray:
    x, srt, n_cand = sorted_candidates(chunk, 0.5)
    k = np.arange(1, srt.shape[1] + 1, dtype=np.float64)
    mean = np.cumsum(srt, axis=1)
    mean /= k
    meansq = np.cumsum(np.square(srt), axis=1)
    meansq /= k
    # delta_k = (1 - ss_k) / k = 1/k - (meansq_k - mean_k^2)
    delta = meansq
    delta -= np.square(mean)
    np.subtract(1.0 / k, delta, out=delta)
    np.maximum(delta, 0.0, out=delta)
    tau = mean
    tau -= np.sqrt(delta, out=delta)
    support = (tau <= srt) & (k <= n_cand[:, None])
    n_support = np.count_nonzero(support, axis=1)
    idx = np.maximum(n_support, 1) - 1
    tau_star = np.take_along_axis(tau, idx[:, None], axis=1)
    tau_star[n_support == 0] = 0.0
    x -= tau_star
    np.maximum(x, 0.0, out=x)
    np.square(x, out=x)
    return x


def entmax15(z: np.ndarray, axis: int = -1) -> np.ndarray:
    """1.5-entmax (Peters, Niculae & Martins 2019), exact and sort-based.

    Solves ``argmax_{p in Delta} <p, z> + H^T_{1.5}(p)`` with the Tsallis
    entropy ``H^T_alpha(p) = sum_j (p_j - p_j^alpha) / (alpha (alpha - 1))``.
    The solution is ``p = max(z' - tau, 0)^2`` with ``z' = (z - max) / 2``;
    tau is found exactly from prefix means and variances of z' sorted
    descending (docs/concepts/normalizers.md, "entmax15").
    """
    return apply_rows(z, axis, _entmax15_rows)
