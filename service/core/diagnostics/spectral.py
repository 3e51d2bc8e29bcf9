"""The per-head spectral norm of the attention logits (service.core.diagnostics.inspection, "spectral norm";
docs/concepts/diagnostics.md).

Per (batch ``b``, query head ``h``) the largest singular value of ``M = Q_h K_h^T * factor`` over the first
``key_lengths[b]`` keys, without forming ``M`` where it is large: ``||M||_2^2 / factor^2`` is the largest eigenvalue
of the ``S x S`` operator ``P = K G_q K^T``, whose non-zero eigenvalues are those of the ``E x E`` product
``C = G_q G_k`` (the Gram matrices ``G_q = Q^T Q``, ``G_k = K^T K``). ``C`` is self-adjoint in the inner product
``<x, y> = x^T G_k y``, which is ``P``'s on the vectors ``K x``: ``P (K x) = K (C x)``.

- **Power iteration** (``min(L, S, E) > SMALL``): the power method on ``C`` from a fixed, seeded start vector
  (Golub & Van Loan, *Matrix Computations*, 4th ed., section 8.2), its steps made cheap by repeated squaring: after
  ``k`` squarings ``C^(2^k)`` (scaled to trace 1) is applied to the iterate, one matrix-vector product worth
  ``2^k`` power steps. After ``FIRST_CHECK`` squarings, and again after each further squaring, ``POWER_STEPS`` such
  products and the check, in float64 from the Gram matrices: with ``z = K y`` for the iterate ``y``, its Rayleigh
  quotient ``rho = z^T P z / z^T z`` and residual ``r = P z - rho z``, the head is done when
  ``||r|| <= tol * rho * ||z||``. That bounds the distance from ``rho`` to an eigenvalue of ``P`` by ``tol * rho``
  (the residual bound for symmetric matrices: Parlett, *The Symmetric Eigenvalue Problem*, chapter 4), and a
  Rayleigh quotient is never above the largest eigenvalue, so ``sqrt(rho)`` is within ``tol / 2`` (relative) of a
  singular value of ``M``: of the largest, the one the power method converges to from a start vector with a
  component along it (a random start has one with probability 1). ``tol`` (``tolerance``): ``1e-6`` for float32
  and float16 requests (computed in float32: about 8 float32 epsilons, above the rounding floor of the float32
  squarings, about ``2e-7``; the float32 Gram matrices add their own rounding, about ``1e-7`` of the norm), ``1e-10``
  for float64 (float64's floor is about ``1e-15``). A head that has not met it after ``MAX_SQUARINGS`` squarings, or
  whose residual has not halved over ``STALL_CHECKS`` checks (two top singular values closer than the iteration
  resolves cheaply, or rounding), falls back to the exact route. Squaring rather than Lanczos: random 64-wide heads
  need a Krylov space of about 24 vectors for ``1e-6``, each Lanczos step about ten small numpy calls, where a
  squaring is one call. Measured at ``(1, 8, 128, 64)`` float32 (the 2-core development VM, minimum of repeated
  calls): about 1.0 to 1.3 ms against 1.9 to 3.0 ms for the exact route, of which the Gram matrices and ``C`` alone
  take about 0.3 ms.
- **Exact** (the fallback, and the route where ``E <= SMALL`` is the smallest dimension): the Cholesky factor
  ``G_q = R R^T`` and numpy's ``eigvalsh`` of the symmetric ``R^T G_k R``, whose eigenvalues are ``C``'s; where
  ``G_q`` is singular (fewer queries than ``E``, repeated queries) the thin QR factorizations ``Q = U R_q``,
  ``K = W R_k``: ``M`` has the singular values of the small ``R_q R_k^T``. Rounding only (float64: 1e-12 of numpy's
  SVD of ``M``).
- **Direct** (``min(L, S) <= SMALL`` and below ``E``): ``M`` itself (at most ``SMALL`` rows or columns), and
  ``eigvalsh`` of its smaller Gram matrix ``M M^T`` or ``M^T M`` in float64. Exact up to rounding.

Gram matrices and ``C`` are in the request's precision (float16 in float32); the results are float64.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np
import numpy.typing as npt

TOLERANCE_FLOAT32 = 1e-6
"""The stopping rule's relative tolerance on ``||M||_2^2`` for float32 (and float16) requests."""
TOLERANCE_FLOAT64 = 1e-10
"""The same for float64 requests."""
SMALL = 32
"""``min(L, S, E)`` at or below which the exact (``E``) or direct (``L`` or ``S``) route is cheaper."""
FIRST_CHECK = 5
"""Squarings before the first check."""
POWER_STEPS = 16
"""Products of the iterate with the current power ``C^(2^k)`` before each check."""
MAX_SQUARINGS = 24
"""Squarings after which a head that has not met the tolerance falls back to the exact route."""
STALL_CHECKS = 3
"""Checks without the residual halving after which a head falls back to the exact route."""
START_SEED = 0x5EC7
"""The seed of the fixed start vector (the same answer on every call)."""


def tolerance(dtype: npt.DTypeLike) -> float:
    """The relative tolerance of the stopping rule for work in ``dtype`` (module docstring)."""
    return TOLERANCE_FLOAT64 if np.dtype(dtype) == np.float64 else TOLERANCE_FLOAT32


def spectral_norms(
    query: np.ndarray,
    key: np.ndarray,
    factor: float,
    key_lengths: np.ndarray | None = None,
    *,
    max_squarings: int = MAX_SQUARINGS,
) -> np.ndarray:
    """``(B, Hq)``: the largest singular value of ``query_h key_h^T * factor`` (``factor`` = scale / T) per head,
    over the first ``key_lengths[b]`` keys (all when None), to the module docstring's tolerance; 0 for a batch
    entry without keys. ``query`` ``(B, Hq, L, E)``, ``key`` ``(B, Hkv, S, E)``; ``max_squarings`` caps the power
    iteration (0: every head by the exact route).
    """
    B, Hq, L, E = query.shape
    S = key.shape[2]
    group = Hq // key.shape[1]
    work = np.float64 if np.result_type(query, key) == np.float64 else np.float32
    q, k = query.astype(work, copy=False), key.astype(work, copy=False)
    if key_lengths is None:
        lengths = np.full(B, S)
    else:
        lengths = np.clip(np.asarray(key_lengths).astype(np.int64).reshape(B), 0, S)
    if min(L, S, E) == 0:  # no queries, keys or features: M is empty or 0
        return np.zeros((B, Hq))
    if min(L, S, E) > SMALL:
        norms = _iterated(q, k, lengths, group, max_squarings)
    elif min(L, S) < E:
        norms = _direct(q, k, lengths, group)
    else:
        norms = _exact_entries(q, k, lengths, group, np.ones((B, Hq), dtype=bool))
    out: np.ndarray = norms * abs(factor)
    return out


def _iterated(q: np.ndarray, k: np.ndarray, lengths: np.ndarray, group: int, max_squarings: int) -> np.ndarray:
    """The power iteration's norms ``(B, Hq)`` (module docstring), the exact route for the heads it leaves."""
    B, Hq, _, E = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    gram_q = np.swapaxes(q, -1, -2) @ q
    if (lengths == S).all():
        gram_k = np.swapaxes(k, -1, -2) @ k
    else:
        gram_k = np.zeros((B, Hkv, E, E), dtype=k.dtype)
        for b in np.flatnonzero(lengths):
            kept = k[b, :, : lengths[b]]
            gram_k[b] = np.swapaxes(kept, -1, -2) @ kept
    shared = np.broadcast_to(gram_k[:, :, None], (B, Hkv, group, E, E))  # each key head's, per query head
    product = gram_q.reshape(B, Hkv, group, E, E) @ shared
    squares, done = _power(gram_q.reshape(-1, E, E), shared.reshape(-1, E, E), product.reshape(-1, E, E), max_squarings)
    norms: np.ndarray = np.sqrt(np.clip(squares, 0.0, None)).reshape(B, Hq)
    missed = ~done.reshape(B, Hq) & (lengths > 0)[:, None]
    if missed.any():
        norms[missed] = _exact_entries(q, k, lengths, group, missed)[missed]
    return norms


def _power(
    gram_q: np.ndarray, gram_k: np.ndarray, product: np.ndarray, max_squarings: int
) -> tuple[np.ndarray, np.ndarray]:
    """``(||M||_2^2 / factor^2, done)`` per head ``(N,)`` by the power iteration on ``product = G_q G_k``
    ``(N, E, E)`` (module docstring); ``done`` is False where the exact route must answer.
    """
    N, E, _ = product.shape
    tol = tolerance(product.dtype)
    squares, done = np.zeros(N), np.zeros(N, dtype=bool)
    trace = np.trace(product, axis1=1, axis2=2)  # ||M||_F^2 / factor^2: 0 only for M = 0
    done[trace == 0] = True
    heads = np.flatnonzero(np.isfinite(trace) & (trace != 0))
    if heads.size == 0 or max_squarings < FIRST_CHECK:
        return squares, done
    if heads.size < N:
        product, gram_q, gram_k, trace = product[heads], gram_q[heads], gram_k[heads], trace[heads]
    # ``product`` is this function's own: scaled to trace 1 (eigenvalues in [0, 1]) and squared in place, with one
    # spare buffer, and no float64 copy of the Gram matrices for the check: fresh memory costs page faults
    power, spare = product, np.empty_like(product)
    power *= (1.0 / np.abs(trace))[:, None, None]
    y = np.tile(_start(E, product.dtype), (heads.size, 1))
    best, stalls = np.full(heads.size, np.inf), np.zeros(heads.size, dtype=np.int64)
    for squaring in range(1, max_squarings + 1):
        power, spare = np.matmul(power, power, out=spare), power
        if squaring < FIRST_CHECK:
            if squaring % 2 == 0:  # unscaled, the top eigenvalue stays above 1 / E^4 in between
                power *= (1.0 / np.trace(power, axis1=1, axis2=2))[:, None, None]
            continue
        power *= (1.0 / np.trace(power, axis1=1, axis2=2))[:, None, None]
        for step in range(POWER_STEPS):
            y = _times(power, y)
            if step % 8 == 7:  # the top eigenvalue of a trace-1 power is at least 1/E: keep y in range
                y *= 1.0 / np.abs(y).max(axis=1, keepdims=True)
        rho, residual = _rayleigh(gram_q, gram_k, y.astype(np.float64))
        met = residual <= tol * rho
        squares[heads[met]], done[heads[met]] = rho[met], True
        stalls = np.where(residual <= 0.5 * best, 0, stalls + 1)
        best = np.fmin(best, residual)
        going = ~met & (stalls < STALL_CHECKS) & np.isfinite(residual)
        if not going.any():
            break
        kept = int(going.sum())
        power, spare = np.compress(going, power, axis=0, out=spare[:kept]), power[:kept]
        heads, y, gram_q, gram_k = heads[going], y[going], gram_q[going], gram_k[going]
        best, stalls = best[going], stalls[going]
    return squares, done


def _rayleigh(gram_q: np.ndarray, gram_k: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per head, for ``z = K y``: the Rayleigh quotient ``z^T P z / z^T z`` and ``||P z - rho z|| / ||z||``, from the
    Gram matrices (``P z = K (C y)``, ``||K x||^2 = x^T G_k x``), in float64 (``y``'s). NaN where ``K y = 0``.
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        gy = _times(gram_k, y)
        norm = np.vecdot(y, gy)
        cy = _times(gram_q, gy)
        rho = np.vecdot(gy, cy) / norm
        r = cy - rho[:, None] * y
        residual = np.sqrt(np.clip(np.vecdot(r, _times(gram_k, r)), 0.0, None) / norm)
    return rho, residual


def _times(matrices: np.ndarray, vectors: np.ndarray) -> np.ndarray:
    """Each matrix ``(N, E, E)`` times its vector ``(N, E)``, in the vectors' precision (``np.matvec`` from numpy
    2.2; einsum casts the matrices chunk by chunk, where matmul would cast a whole copy).
    """
    if matrices.dtype == vectors.dtype:
        product: np.ndarray = (matrices @ vectors[..., None])[..., 0]
    else:
        product = np.einsum("nij,nj->ni", matrices, vectors, dtype=vectors.dtype, casting="same_kind")
    return product


@lru_cache(maxsize=16)
def _start(E: int, dtype: np.dtype[Any]) -> np.ndarray:
    """The fixed start vector of length ``E`` (seeded: the same on every call), read-only."""
    start = np.random.default_rng(START_SEED).standard_normal(E).astype(dtype)
    start.setflags(write=False)
    return start


def _direct(q: np.ndarray, k: np.ndarray, lengths: np.ndarray, group: int) -> np.ndarray:
    """``(B, Hq)`` through ``M`` itself and its smaller Gram matrix (``min(L, S) <= SMALL``, module docstring)."""
    B, Hq, L, E = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    logits = q.reshape(B, Hkv, group, L, E) @ np.swapaxes(k, -1, -2)[:, :, None]  # (B, Hkv, group, L, S)
    kept = np.arange(S) < lengths[:, None]
    logits = np.where(kept[:, None, None, None, :], logits, 0.0).astype(np.float64)
    gram = logits @ np.swapaxes(logits, -1, -2) if L <= S else np.swapaxes(logits, -1, -2) @ logits
    top = np.linalg.eigvalsh(gram)[..., -1].reshape(B, Hq)
    norms: np.ndarray = np.sqrt(np.clip(top, 0.0, None))
    return norms


def _exact_entries(q: np.ndarray, k: np.ndarray, lengths: np.ndarray, group: int, heads: np.ndarray) -> np.ndarray:
    """``(B, Hq)``, exact for the ``heads`` ``(B, Hq)`` marked (0 elsewhere): one batch entry at a time."""
    B, Hq = q.shape[:2]
    out = np.zeros((B, Hq))
    for b in np.flatnonzero(heads.any(axis=1) & (lengths > 0)):
        keys = k[b, :, : lengths[b]]
        if heads[b].all():
            out[b] = _exact(q[b], keys, group)
        else:
            chosen = np.flatnonzero(heads[b])
            out[b, chosen] = _exact(q[b, chosen], keys[chosen // group], 1)
    return out


def _exact(q: np.ndarray, k: np.ndarray, group: int) -> np.ndarray:
    """``(Hq,)``: the largest singular value of ``q_h k_h^T`` per head, exactly (module docstring); ``q``
    ``(Hq, L, E)``, ``k`` ``(Hkv, n, E)`` with ``n > 0``.
    """
    Hkv, E = k.shape[0], q.shape[-1]
    gram_q = np.swapaxes(q, -1, -2) @ q
    gram_k = (np.swapaxes(k, -1, -2) @ k)[:, None]  # (Hkv, 1, E, E): shared by the group's query heads
    try:
        root = np.linalg.cholesky(gram_q).reshape(Hkv, group, E, E)
    except np.linalg.LinAlgError:  # a singular G_q in some head: the QR route for every head here
        return _qr_norms(q.astype(np.float64), k.astype(np.float64), group)
    symmetric = np.swapaxes(root, -1, -2) @ gram_k @ root
    norms: np.ndarray = np.sqrt(np.clip(np.linalg.eigvalsh(symmetric)[..., -1].reshape(-1), 0.0, None))
    return norms


def _qr_norms(q: np.ndarray, k: np.ndarray, group: int) -> np.ndarray:
    """The largest singular value of ``q_h k_h^T`` per head through the thin QR factorizations (module docstring)."""
    r_keys = np.linalg.qr(k, mode="r")
    r_query = np.linalg.qr(q, mode="r")
    small = r_query @ np.swapaxes(np.repeat(r_keys, group, axis=0), -1, -2)
    norms: np.ndarray = np.linalg.svd(small, compute_uv=False)[:, 0]
    return norms
