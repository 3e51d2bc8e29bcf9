"""Attention normalizers and their vector-Jacobian products (semantics.md, "Normalizers").

Every forward map turns a score vector ``z`` into weights on the probability
simplex ``Delta = {p : p >= 0, sum(p) = 1}``, along ``axis`` of an array of any
rank. Shared contract:

- masked positions arrive as ``-inf`` and come out as exactly 0;
- a fully masked row (all ``-inf``) comes out as all zeros, never NaN, and no
  floating-point warning is raised (no ``inf - inf``, ``0/0`` or ``log 0`` is
  ever evaluated);
- the row max (over the finite entries) is subtracted first, so very large
  scores (``1e4`` in float32) are safe; ``relu`` is the exception because it is
  not shift invariant;
- floating dtypes are preserved (non-floating input is computed as float64).
  Sort-based and bisection normalizers compute in float64 internally, in row
  chunks of bounded size, and cast back.

``+inf`` and NaN scores are outside the contract (NaN propagates).

References:
    A. F. T. Martins and R. F. Astudillo, "From Softmax to Sparsemax: A Sparse
    Model of Attention and Multi-Label Classification", ICML 2016.
    B. Peters, V. Niculae and A. F. T. Martins, "Sparse Sequence-to-Sequence
    Models", ACL 2019.
    M. Blondel, A. F. T. Martins and V. Niculae, "Learning with Fenchel-Young
    Losses", JMLR 21, 2020.

"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

__all__ = [
    "NORMALIZER_NAMES",
    "entmax15",
    "entmax_backward",
    "entmax_bisect",
    "log_softmax",
    "normalize",
    "normalize_backward",
    "relu_backward",
    "relu_normalize",
    "relu_row_sums",
    "softmax",
    "softmax_backward",
    "sparsemax",
    "sparsemax_backward",
]

NORMALIZER_NAMES: tuple[str, ...] = ("softmax", "sparsemax", "entmax15", "entmax", "relu")

# Rows are processed in chunks of about this many elements by the sort-based and
# bisection normalizers, so float64 temporaries stay a few MiB whatever the input.
_CHUNK_ELEMENTS = 1 << 17
# Upper bound on bisection steps when ``n_iter`` is None (stops earlier once tau
# no longer moves in float64; about 53 to 90 steps in practice).
_MAX_BISECT_ITER = 200


# --------------------------------------------------------------------------- helpers


def _as_float(z: np.ndarray) -> np.ndarray:
    """``z`` as an array of a floating dtype (float64 for non-floating input)."""
    z = np.asarray(z)
    if not np.issubdtype(z.dtype, np.floating):
        z = z.astype(np.float64)
    return z


def _row_max(z: np.ndarray, axis: int) -> np.ndarray:
    """Row max with keepdims; rows with no finite entry (max ``-inf``) get 0."""
    m: np.ndarray = np.max(z, axis=axis, keepdims=True)
    m[m == -np.inf] = 0
    return m


def _safe_denominator(s: np.ndarray) -> np.ndarray:
    """Replace zero row sums (fully masked rows) by 1, in place, so 0/1 = 0."""
    s[s == 0] = 1
    return s


def _apply_rows(z: np.ndarray, axis: int, fn: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """Apply ``fn`` (2-D chunk of rows in z's dtype -> float64 weights) along ``axis``."""
    z = _as_float(z)
    if z.size == 0:
        return np.zeros_like(z)
    zm = np.moveaxis(z, axis, -1)
    shape = zm.shape
    d = shape[-1]
    rows = zm.reshape(-1, d)
    out = np.empty(rows.shape, dtype=z.dtype)
    step = max(1, _CHUNK_ELEMENTS // d)
    # z - max may overflow to -inf (e.g. -1e308 - 1e308): such an entry is far below the support anyway.
    with np.errstate(under="ignore", over="ignore"):
        for start in range(0, rows.shape[0], step):
            out[start : start + step] = fn(rows[start : start + step])
    return np.moveaxis(out.reshape(shape), -1, axis)


def _prepare(chunk: np.ndarray, scale: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
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
    m = _row_max(x, axis=1)
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


# --------------------------------------------------------------------------- softmax


def softmax(z: np.ndarray, axis: int = -1, *, out: np.ndarray | None = None) -> np.ndarray:
    """Softmax: ``exp(z - max) / sum(exp(z - max))``.

    Solves ``argmax_{p in Delta} <p, z> + H(p)`` with Shannon entropy
    ``H(p) = -sum_j p_j log p_j`` (the alpha -> 1 limit of entmax; Blondel et
    al. 2020). ``out`` may be ``z`` itself: the max is subtracted, exponentiated
    and divided in place, and only per-row temporaries are allocated.
    """
    z = _as_float(z)
    if out is None:
        if z.size == 0:
            return np.zeros_like(z)
        m = _row_max(z, axis)
        with np.errstate(over="ignore"):  # z - max overflowing to -inf has weight exp(-inf) = 0: right
            res: np.ndarray = np.subtract(z, m)
    else:
        if out.shape != z.shape:
            raise ValueError(f"out has shape {out.shape}, expected {z.shape}")
        if not np.issubdtype(out.dtype, np.floating):
            raise TypeError(f"out must have a floating dtype, got {out.dtype}")
        if z.size == 0:
            return out
        m = _row_max(z, axis)
        with np.errstate(over="ignore"):  # z - max overflowing to -inf has weight exp(-inf) = 0: right
            res = np.subtract(z, m, out=out)
    with np.errstate(under="ignore"):
        np.exp(res, out=res)
        s = _safe_denominator(np.sum(res, axis=axis, keepdims=True))
        np.divide(res, s, out=res)
    return res


def log_softmax(z: np.ndarray, axis: int = -1) -> np.ndarray:
    """Log of softmax: ``z - max - log(sum(exp(z - max)))``.

    Masked positions give ``-inf``; a fully masked row gives all ``-inf``. A log-probability below the
    dtype's range comes out ``-inf`` too: callers that must tell it from a masked position compute in a
    wider dtype (as :func:`service.core.probabilities.normalize_logits` does).
    """
    z = _as_float(z)
    if z.size == 0:
        return np.zeros_like(z)
    with np.errstate(over="ignore"):
        shifted: np.ndarray = z - _row_max(z, axis)
    with np.errstate(under="ignore"):
        s = _safe_denominator(np.sum(np.exp(shifted), axis=axis, keepdims=True))
    shifted -= np.log(s)
    return shifted


# --------------------------------------------------------------------------- sparsemax


def _sparsemax_rows(chunk: np.ndarray) -> np.ndarray:
    x, srt, n_cand = _prepare(chunk, 1.0)
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
    return _apply_rows(z, axis, _sparsemax_rows)


# --------------------------------------------------------------------------- entmax


def _entmax15_rows(chunk: np.ndarray) -> np.ndarray:
    x, srt, n_cand = _prepare(chunk, 0.5)
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
    descending (semantics.md, "Normalizers").
    """
    return _apply_rows(z, axis, _entmax15_rows)


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
    """
    alpha = float(alpha)
    if not (np.isfinite(alpha) and alpha > 1.0):
        raise ValueError(f"entmax needs alpha > 1, got {alpha} (use softmax for alpha = 1)")
    if n_iter is not None and n_iter < 0:
        raise ValueError(f"n_iter must be >= 0, got {n_iter}")
    am1 = alpha - 1.0
    inv = 1.0 / am1

    def rows(chunk: np.ndarray) -> np.ndarray:
        x, cand, n_cand = _prepare(chunk, am1)
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
        p /= _safe_denominator(p.sum(axis=1, keepdims=True))
        return p

    return _apply_rows(z, axis, rows)


# --------------------------------------------------------------------------- relu


def relu_normalize(z: np.ndarray, axis: int = -1) -> np.ndarray:
    """ReLU normalizer: ``relu(z) / sum(relu(z))``; rows with relu sum 0 give zeros.

    Not a regularised argmax and not shift invariant, so the row max is not
    subtracted; rows are scaled by their largest relu value before summing so
    huge scores cannot overflow the sum. It is invariant to a positive factor
    (``relu(c z) = c relu(z)``), so callers may leave out the temperature (and,
    without a bias, the scale) rather than let them underflow or overflow.
    """
    z = _as_float(z)
    if z.size == 0:
        return np.zeros_like(z)
    r: np.ndarray = np.maximum(z, 0)
    with np.errstate(under="ignore"):
        r /= _safe_denominator(np.max(r, axis=axis, keepdims=True))
        r /= _safe_denominator(np.sum(r, axis=axis, keepdims=True))
    return r


# --------------------------------------------------------------------------- backward


def _float_pair(p: np.ndarray, g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    p = _as_float(p)
    g = np.asarray(g)
    dtype = np.result_type(p.dtype, g.dtype)
    if not np.issubdtype(dtype, np.floating):
        dtype = np.dtype(np.float64)
    return p.astype(dtype, copy=False), g.astype(dtype, copy=False)


def softmax_backward(p: np.ndarray, g: np.ndarray, axis: int = -1) -> np.ndarray:
    """Softmax VJP: ``dz = p * (g - sum(p * g))``, with p the softmax output."""
    p, g = _float_pair(p, g)
    pg = p * np.where(p > 0, g, 0)
    grad: np.ndarray = pg - p * np.sum(pg, axis=axis, keepdims=True)
    return grad


def sparsemax_backward(p: np.ndarray, g: np.ndarray, axis: int = -1) -> np.ndarray:
    """Sparsemax VJP: on the support ``S = {p > 0}``, ``dz_i = g_i - mean_S g``; 0 elsewhere."""
    p, g = _float_pair(p, g)
    support = p > 0
    gs = np.where(support, g, 0)
    n = np.count_nonzero(support, axis=axis, keepdims=True)
    mean = np.sum(gs, axis=axis, keepdims=True) / np.maximum(n, 1).astype(gs.dtype)
    return np.where(support, gs - mean, 0).astype(gs.dtype, copy=False)


def entmax_backward(p: np.ndarray, g: np.ndarray, alpha: float, axis: int = -1) -> np.ndarray:
    """alpha-entmax VJP: ``w = p^(2-alpha)`` on the support, ``dz = w g - (sum(w g)/sum(w)) w``.

    ``alpha = 1.5`` is entmax15's and ``alpha = 2`` sparsemax's backward.
    """
    alpha = float(alpha)
    if not (np.isfinite(alpha) and alpha > 1.0):
        raise ValueError(f"entmax needs alpha > 1, got {alpha}")
    p, g = _float_pair(p, g)
    support = p > 0
    w = np.zeros_like(p)
    np.power(p, 2.0 - alpha, out=w, where=support)
    wg = w * np.where(support, g, 0)
    sw = _safe_denominator(np.sum(w, axis=axis, keepdims=True))
    grad: np.ndarray = wg - (np.sum(wg, axis=axis, keepdims=True) / sw) * w
    return grad


def relu_backward(z: np.ndarray, g: np.ndarray, axis: int = -1, *, p: np.ndarray | None = None) -> np.ndarray:
    """VJP of ``p = relu(z) / s``, ``s = sum(relu(z))``: ``dz_j = [z_j > 0] (g_j - sum(g p)) / s``.

    Rows with ``s = 0`` get a zero gradient (as do positions with ``z_j <= 0``). ``p`` defaults to
    :func:`relu_normalize` of ``z``; a caller that has the weights passes them. ``s`` is never summed:
    it is :func:`relu_row_sums`, so scores near the dtype's limits neither overflow it nor lose it.
    """
    z, g = _float_pair(z, g)
    if p is None:
        p = relu_normalize(z, axis)
    active = z > 0
    grad: np.ndarray = np.where(active, g, 0)  # g may hold anything off the support (masked positions)
    with np.errstate(under="ignore", over="ignore"):
        grad -= np.sum(grad * p, axis=axis, keepdims=True)
        grad /= relu_row_sums(z, p, axis)
    grad *= active
    return grad.astype(z.dtype, copy=False)


def relu_row_sums(z: np.ndarray, p: np.ndarray, axis: int = -1) -> np.ndarray:
    """``sum(relu(z))`` per row (keepdims) from the scores and their relu weights ``p``, as ``max(z) / max(p)``.

    ``max(p) = max(z) / s`` on a row with a positive score, so the quotient gives ``s`` to a few ulps
    without summing (a sum of scores near 1e308 overflows; ``max(z)`` and ``max(p) >= 1 / n`` do not).
    Rows without a positive score give 1 (their gradients are 0 anyway).
    """
    p_max = np.max(p, axis=axis, keepdims=True)
    z_max = np.max(z, axis=axis, keepdims=True)
    live = (p_max > 0) & (z_max > 0)
    with np.errstate(under="ignore", over="ignore"):
        sums: np.ndarray = np.where(live, z_max / np.where(live, p_max, 1), 1)
    return sums


# --------------------------------------------------------------------------- dispatch


def _check_name(normalizer: str) -> None:
    if normalizer not in NORMALIZER_NAMES:
        raise ValueError(f"unknown normalizer {normalizer!r}; expected one of {', '.join(NORMALIZER_NAMES)}")


def _entmax_alpha(alpha: float | None) -> float:
    if alpha is None:
        raise ValueError("normalizer 'entmax' needs alpha > 1")
    a = float(alpha)
    if not (np.isfinite(a) and a > 1.0):
        raise ValueError(f"normalizer 'entmax' needs alpha > 1, got {alpha} (use softmax)")
    return a


def normalize(
    z: np.ndarray,
    normalizer: str,
    *,
    alpha: float | None = None,
    axis: int = -1,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Apply the named normalizer along ``axis``.

    ``"entmax"`` needs ``alpha > 1`` (ValueError otherwise); ``alpha == 1.5``
    routes to the exact sort-based :func:`entmax15` and ``alpha == 2.0`` to
    :func:`sparsemax`, any other alpha to :func:`entmax_bisect`. ``alpha`` is
    ignored by the other normalizers. ``out`` (same shape, floating) receives the
    result and is returned; it may be ``z`` itself. For ``"softmax"`` the work is
    done in ``out`` with no full-size temporaries; the others compute and copy.
    """
    _check_name(normalizer)
    if normalizer == "softmax":
        return softmax(z, axis, out=out)
    if normalizer == "sparsemax":
        res = sparsemax(z, axis)
    elif normalizer == "entmax15":
        res = entmax15(z, axis)
    elif normalizer == "relu":
        res = relu_normalize(z, axis)
    else:
        a = _entmax_alpha(alpha)
        if a == 2.0:
            res = sparsemax(z, axis)
        elif a == 1.5:
            res = entmax15(z, axis)
        else:
            res = entmax_bisect(z, a, axis)
    if out is None:
        return res
    if out.shape != res.shape:
        raise ValueError(f"out has shape {out.shape}, expected {res.shape}")
    np.copyto(out, res, casting="same_kind")
    return out


def normalize_backward(
    normalizer: str,
    p: np.ndarray,
    g: np.ndarray,
    *,
    alpha: float | None = None,
    z: np.ndarray | None = None,
    axis: int = -1,
) -> np.ndarray:
    """Vector-Jacobian product: given ``g = dL/dp`` on the output ``p``, return ``dL/dz``.

    ``"entmax"`` needs ``alpha > 1``; ``"relu"`` needs the scores ``z`` too (its
    Jacobian is not a function of ``p`` alone), and ``p`` must be their relu weights.
    """
    _check_name(normalizer)
    if normalizer == "softmax":
        return softmax_backward(p, g, axis)
    if normalizer == "sparsemax":
        return sparsemax_backward(p, g, axis)
    if normalizer == "entmax15":
        return entmax_backward(p, g, 1.5, axis)
    if normalizer == "entmax":
        return entmax_backward(p, g, _entmax_alpha(alpha), axis)
    if z is None:
        raise ValueError("normalize_backward('relu', ...) needs the scores z")
    return relu_backward(z, g, axis, p=p)
