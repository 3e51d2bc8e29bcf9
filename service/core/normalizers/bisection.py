"""alpha-entmax for any alpha > 1, by bisection on the threshold tau (docs/concepts/normalizers.md, "alpha-entmax")."""

from __future__ import annotations

import numpy as np

from service.core.normalizers.rows import apply_rows, safe_denominator, sorted_candidates

# Upper bound on bisection steps when ``n_iter`` is None (stops earlier once tau
# no longer moves in float64; about 53 to 90 steps in practice).
_MAX_BISECT_ITER = 200
NEAR_ONE = 2.0**-6
"""Below this ``alpha - 1`` the weights are evaluated as ``exp(log1p(.) / (alpha - 1))`` (:func:`_rows_near_one`)."""
# Halvings of the near-one bracket [0, ln n] when ``n_iter`` is None: down to ln(n) 2^-56, below float64's resolution.
_NEAR_ONE_STEPS = 56


def _entmax_power(x: np.ndarray, inv: float) -> np.ndarray:
    """``max(x, 0) ** inv`` in place on ``x``."""
    np.maximum(x, 0.0, out=x)
    if inv == 2.0:
        np.square(x, out=x)
    elif inv != 1.0:
        np.power(x, inv, out=x)
    return x


def entmax_bisect(z: np.ndarray, alpha: float, axis: int = -1, n_iter: int | None = None) -> np.ndarray:
    """alpha-entmax by bisection (Peters, Niculae & Martins 2019; Blondel et al. 2020).

    Solves ``argmax_{p in Delta} <p, z> + H^T_alpha(p)`` with the Tsallis
    entropy ``H^T_alpha(p) = sum_j (p_j - p_j^alpha) / (alpha (alpha - 1))``,
    ``alpha > 1``. The solution is ``p = max((alpha - 1) z - tau, 0)^(1/(alpha-1))``;
    with ``x = (alpha - 1)(z - max)``, tau lies in ``[-1, -(1/n)^(alpha-1)]``
    (n = number of unmasked entries) and is bisected on, as in the entmax
    package's ``entmax_bisect``. ``n_iter`` None bisects until tau stops moving
    in float64; the result is renormalised to sum 1. Always the bisection
    algorithm, also for alpha 1.5 and 2.

    Below ``alpha - 1 = NEAR_ONE`` (2^-6) that form is ill-conditioned: ``x - tau`` is close to 1 and
    its rounding error is raised to the power ``1/(alpha-1)`` (an error of 1e-5 at ``alpha - 1 = 1e-12``).
    There the same weights are computed from ``tau = (alpha-1) lam - 1`` as
    ``exp(log1p((alpha-1)(z - max - lam)) / (alpha-1))`` and lam is bisected on instead
    (:func:`_rows_near_one`): accurate to about 1e-15 for any ``alpha - 1``, and softmax in the limit.
    """
    alpha = float(alpha)
    if not (np.isfinite(alpha) and alpha > 1.0):
        raise ValueError(f"entmax needs alpha > 1, got {alpha} (use softmax for alpha = 1)")
    if n_iter is not None and n_iter < 0:
        raise ValueError(f"n_iter must be >= 0, got {n_iter}")
    am1 = alpha - 1.0
    inv = 1.0 / am1
    if am1 < NEAR_ONE:
        return apply_rows(z, axis, lambda chunk: _rows_near_one(chunk, am1, n_iter))

    def rows(chunk: np.ndarray) -> np.ndarray:
        x, cand, n_cand = sorted_candidates(chunk, am1)
        # Padding columns of ``cand`` must contribute nothing: make them -inf.
        pad = np.arange(cand.shape[1]) >= n_cand[:, None]
        cand[pad] = -np.inf
        n = np.maximum(n_cand, 1).astype(np.float64)[:, None]
        tau_lo = np.full_like(n, -1.0)
        # f(tau) = sum p(x - tau) - 1 >= 0 at -1; <= 0 at -(1/n)^(alpha-1), n the
        # number of unmasked entries (here: of candidates, a tighter valid bound).
        dm = (-(n**-am1)) - tau_lo
        buf = np.empty_like(cand)
        limit = _MAX_BISECT_ITER if n_iter is None else n_iter
        for _ in range(limit):
            dm *= 0.5
            tau_m = tau_lo + dm
            if n_iter is None and np.array_equal(tau_m, tau_lo):
                break
            np.subtract(cand, tau_m, out=buf)
            f = _entmax_power(buf, inv).sum(axis=1, keepdims=True)
            tau_lo = np.where(f >= 1.0, tau_m, tau_lo)
        # At tau_lo the unnormalised mass is >= 1 for every row with a finite entry.
        x -= tau_lo
        p = _entmax_power(x, inv)
        p /= safe_denominator(p.sum(axis=1, keepdims=True))
        return p

    return apply_rows(z, axis, rows)


def _log1p_power(v: np.ndarray, inv: float) -> np.ndarray:
    """``max(1 + v, 0) ** inv`` in place on ``v``, as ``exp(log1p(v) * inv)``: a few ulps however small v is."""
    np.maximum(v, -1.0, out=v)
    with np.errstate(divide="ignore"):  # log1p(-1) = -inf: weight exp(-inf) = 0, off the support
        np.log1p(v, out=v)
    v *= inv
    np.exp(v, out=v)
    return v


def _rows_near_one(chunk: np.ndarray, am1: float, n_iter: int | None) -> np.ndarray:
    """alpha-entmax of a 2-D chunk of rows for ``alpha - 1 = am1`` below :data:`NEAR_ONE`.

    With ``y = z - max`` and ``tau = am1 * lam - 1``, ``p = (1 + am1 (y - lam))_+^(1/am1)``, evaluated as
    ``exp(log1p(am1 (y - lam)) / am1)``: log1p keeps the small ``am1 (y - lam)`` to full precision, where
    ``1 + am1 (y - lam)`` would round it away before the power amplifies the error by ``1/am1``. The mass
    is >= 1 at ``lam = 0`` (the top entry alone has weight 1) and <= 1 at ``lam = (1 - n^-am1) / am1``,
    which ``ln n`` bounds from above; lam is bisected on that bracket (``n_iter`` halvings, or
    :data:`_NEAR_ONE_STEPS`), then the weights are renormalised to sum 1.
    """
    inv = 1.0 / am1
    x, cand, n_cand = sorted_candidates(chunk, am1)  # x = am1 * y; candidates am1 * y > -1
    pad = np.arange(cand.shape[1]) >= n_cand[:, None]
    cand[pad] = -np.inf
    n = np.maximum(n_cand, 1).astype(np.float64)[:, None]
    lam_lo = np.zeros_like(n)
    dm = np.log(n)
    buf = np.empty_like(cand)
    for _ in range(_NEAR_ONE_STEPS if n_iter is None else n_iter):
        dm *= 0.5
        lam_m = lam_lo + dm
        np.subtract(cand, am1 * lam_m, out=buf)
        f = _log1p_power(buf, inv).sum(axis=1, keepdims=True)
        lam_lo = np.where(f >= 1.0, lam_m, lam_lo)
    x -= am1 * lam_lo
    p = _log1p_power(x, inv)
    p /= safe_denominator(p.sum(axis=1, keepdims=True))
    return p
