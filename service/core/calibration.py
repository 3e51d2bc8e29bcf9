"""Temperature scaling (Guo et al. 2017, "On Calibration of Modern Neural Networks"), in numpy only.

``fit_temperature`` finds ``T* = argmin_T mean_i -log softmax(z_i / T)[y_i]`` over ``T`` in
``[0.01, 100]``. With ``b = 1/T`` the mean NLL ``f(b) = mean_i (lse(b z_i) - b z_{i,y_i})`` is convex:
``f'(b) = mean_i (E_p[z_i] - z_{i,y_i})`` and ``f''(b) = mean_i Var_p(z_i) >= 0`` with ``p = softmax(b z_i)``.
So the optimum is where ``f'`` changes sign: safeguarded Newton steps inside a bracket ``[lo, hi]`` on
which ``f'`` goes from negative to positive, falling back to bisection whenever a step leaves the
bracket, until the bracket is narrower than ``1e-12 * b`` (the spec asks for 1e-6 relative on T).
When ``f'`` has one sign over the whole interval the optimum is at an end (``bounded``).

``reliability`` gives the expected calibration error (Naeini et al. 2015; Guo et al. 2017) with M equal-width
bins ``((m-1)/M, m/M]`` of the confidence (max probability; the prediction is the argmax, lowest
index on ties) and each bin's count, mean confidence and accuracy, for a reliability diagram.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from service.core.errors import InvalidInput

T_MIN = 0.01
T_MAX = 100.0
RELATIVE_TOLERANCE = 1e-12
MAX_ITERATIONS = 200
MAX_ABS_LOGIT = 1e150
"""Larger logits would overflow the variance ``(z / 0.01)**2`` of the Newton step in float64."""


def check_inputs(logits: np.ndarray, labels: np.ndarray) -> None:
    """Shapes and ranges /v1/calibrate accepts: logits (N, C) with N >= 1 and C >= 2, finite; N labels in [0, C)."""
    if logits.ndim != 2:
        raise InvalidInput(f"logits must have shape (N, C), got rank {logits.ndim}", ("logits",))
    n, c = logits.shape
    if n == 0:
        raise InvalidInput("logits has no rows (N = 0): nothing to calibrate", ("logits",))
    if c < 2:
        raise InvalidInput(f"logits has {c} class; calibration needs at least 2", ("logits", "shape", 1))
    if labels.ndim != 1 or labels.shape[0] != n:
        raise InvalidInput(f"labels must hold N = {n} class indices (one per row), got {labels.shape[0]}", ("labels",))
    bad_rows = np.nonzero((labels < 0) | (labels >= c))[0]
    if bad_rows.size:
        i = int(bad_rows[0])
        raise InvalidInput(f"labels[{i}] = {int(labels[i])} is not a class index in [0, {c})", ("labels", i))
    bad = ~np.isfinite(logits)
    if bad.any():
        i, j = (int(v) for v in np.argwhere(bad)[0])
        raise InvalidInput(f"logits[{i}, {j}] is {logits[i, j]}; values must be finite", ("logits", i, j))
    magnitude = np.abs(logits)
    r, k = (int(v) for v in np.unravel_index(int(np.argmax(magnitude)), logits.shape))
    if float(magnitude[r, k]) > MAX_ABS_LOGIT:
        raise InvalidInput(
            f"logits[{r}, {k}] = {logits[r, k]} is too large to calibrate (|logit| <= {MAX_ABS_LOGIT:g}: its square "
            "over the smallest temperature must stay finite)",
            ("logits", r, k),
        )


def _softmax_stats(z: np.ndarray, zy: np.ndarray, b: float) -> tuple[float, float, float]:
    """(f, f', f'') at ``b = 1/T``: mean NLL, its derivative and second derivative with respect to b."""
    x = b * z
    m = x.max(axis=1, keepdims=True)
    with np.errstate(under="ignore"):
        e = np.exp(x - m)
    s = e.sum(axis=1)
    p = e / s[:, None]
    mean_z = np.einsum("ij,ij->i", p, z)
    d = z - mean_z[:, None]
    var = np.einsum("ij,ij->i", p, d * d)  # centred: no cancellation between E[z^2] and E[z]^2
    lse = np.log(s) + m[:, 0]
    f = float(np.mean(lse - b * zy))
    g = float(np.mean(mean_z - zy))
    h = float(np.mean(var))
    return f, g, h


def mean_nll(logits: np.ndarray, labels: np.ndarray, temperature: float = 1.0) -> float:
    """Mean negative log-likelihood of the labels under ``softmax(logits / temperature)``."""
    z = np.asarray(logits, dtype=np.float64)
    zy = z[np.arange(z.shape[0]), labels]
    return _softmax_stats(z, zy, 1.0 / temperature)[0]


@dataclass(frozen=True, slots=True)
class Fit:
    temperature: float
    bounded: bool
    iterations: int


def fit_temperature(logits: np.ndarray, labels: np.ndarray) -> Fit:
    """The temperature in [0.01, 100] minimizing the mean NLL (Guo et al. 2017), by safeguarded Newton on 1/T."""
    z = np.asarray(logits, dtype=np.float64)
    zy = z[np.arange(z.shape[0]), labels]
    lo, hi = 1.0 / T_MAX, 1.0 / T_MIN
    g_lo = _softmax_stats(z, zy, lo)[1]
    g_hi = _softmax_stats(z, zy, hi)[1]
    if g_lo >= 0 and g_hi <= 0:  # f' is monotone, so it is 0 throughout: every T fits equally well
        return Fit(1.0, bounded=False, iterations=2)
    if g_lo >= 0:  # f increases from the smallest b = 1/T: the largest temperature is best
        return Fit(T_MAX, bounded=True, iterations=2)
    if g_hi <= 0:  # f decreases up to the largest b: the smallest temperature is best
        return Fit(T_MIN, bounded=True, iterations=2)
    b = 1.0
    iterations = 2
    while iterations < MAX_ITERATIONS:
        iterations += 1
        _, g, h = _softmax_stats(z, zy, b)
        if g == 0:
            break
        if g < 0:
            lo = b
        else:
            hi = b
        newton = b - g / h if h > 0 else -1.0
        # A Newton step that leaves the bracket is replaced by bisection in log b (the bracket spans 1e4).
        nxt = newton if lo < newton < hi else float(np.sqrt(lo * hi))
        done = abs(nxt - b) <= RELATIVE_TOLERANCE * b or hi - lo <= RELATIVE_TOLERANCE * b
        b = nxt
        if done:
            break
    return Fit(float(1.0 / b), bounded=False, iterations=iterations)


@dataclass(frozen=True, slots=True)
class Reliability:
    """ECE and the bins of a reliability diagram; empty bins have count 0 and confidence/accuracy None."""

    ece: float
    accuracy: float
    lower: np.ndarray
    upper: np.ndarray
    count: np.ndarray
    confidence: np.ndarray
    bin_accuracy: np.ndarray

    def bins(self) -> list[dict[str, float | int | None]]:
        out: list[dict[str, float | int | None]] = []
        for lo, up, n, conf, acc in zip(
            self.lower, self.upper, self.count, self.confidence, self.bin_accuracy, strict=True
        ):
            empty = int(n) == 0
            out.append(
                {
                    "lower": float(lo),
                    "upper": float(up),
                    "count": int(n),
                    "confidence": None if empty else float(conf),
                    "accuracy": None if empty else float(acc),
                }
            )
        return out


def reliability(logits: np.ndarray, labels: np.ndarray, temperature: float = 1.0, bins: int = 15) -> Reliability:
    """ECE ``sum_m |B_m|/N |acc(B_m) - conf(B_m)|`` over ``bins`` equal-width bins ``((m-1)/M, m/M]``."""
    z = np.asarray(logits, dtype=np.float64) / temperature
    m = z.max(axis=1, keepdims=True)
    with np.errstate(under="ignore"):
        e = np.exp(z - m)
    confidence = 1.0 / e.sum(axis=1)  # the max probability: exp(0) / sum
    prediction = np.argmax(z, axis=1)  # lowest index on ties
    correct = (prediction == labels).astype(np.float64)
    edges = np.linspace(0.0, 1.0, bins + 1)
    which = np.clip(np.searchsorted(edges, confidence, side="left") - 1, 0, bins - 1)
    count = np.bincount(which, minlength=bins)
    conf_sum = np.bincount(which, weights=confidence, minlength=bins)
    acc_sum = np.bincount(which, weights=correct, minlength=bins)
    safe = np.maximum(count, 1)
    n = z.shape[0]
    ece = float(np.sum(np.abs(acc_sum - conf_sum)) / n)
    return Reliability(
        ece=ece,
        accuracy=float(correct.mean()),
        lower=edges[:-1],
        upper=edges[1:],
        count=count,
        confidence=conf_sum / safe,
        bin_accuracy=acc_sum / safe,
    )


@dataclass(frozen=True, slots=True)
class Calibration:
    """The result of :func:`calibrate`: the fitted T and NLL/ECE/reliability before (T = 1) and after."""

    fit: Fit
    nll_before: float
    nll_after: float
    before: Reliability
    after: Reliability


def calibrate(logits: np.ndarray, labels: np.ndarray, bins: int = 15) -> Calibration:
    """Check the inputs, fit T, and measure the calibration before and after."""
    labels = np.asarray(labels)
    check_inputs(logits, labels)
    if bins < 1:
        raise InvalidInput("bins must be >= 1", ("bins",))
    z = np.asarray(logits, dtype=np.float64)
    y = labels.astype(np.int64)
    fit = fit_temperature(z, y)
    return Calibration(
        fit=fit,
        nll_before=mean_nll(z, y, 1.0),
        nll_after=mean_nll(z, y, fit.temperature),
        before=reliability(z, y, 1.0, bins),
        after=reliability(z, y, fit.temperature, bins),
    )
