"""The scalars the scores are formed with, rounded once, and the refusals of scores that overflow.

``scale / temperature`` and ``bias / temperature`` are divided in float64 and rounded once to the
compute dtype (both engines use these functions, so they get the same values); a result that does
not fit the dtype is a :class:`~service.core.errors.NumericalError`, never a silent dead row or a
``null`` score.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from service.core.errors import NumericalError, wider_remedies


def widened_factor(factor: float | np.floating, dtype: np.dtype | type) -> bool:
    """Whether :func:`score_factor` gave ``factor`` in float64 because ``dtype`` cannot hold it as a normal number."""
    return bool(np.asarray(factor).dtype != np.dtype(dtype))


class ScoreOverflow(NumericalError):
    """Scores that are not finite at a position no mask removes, found by the cheap check where they are formed;
    :func:`service.core.attention.overflow.explain_score_overflow` finds which and why (the engines' dispatch
    raises that instead).
    """


def overflow_error(dtype: np.dtype | type, what: str = "the scores") -> ScoreOverflow:
    """The invalid-input error of a result that does not fit the compute dtype (never a silent dead row or a null)."""
    name = np.dtype(dtype).name
    hint = "retry with precision float64 or smaller inputs" if name != "float64" else "use smaller inputs"
    return ScoreOverflow(
        f"{what} overflow {name} (|(scale * q.k + bias) / temperature| > {float(np.finfo(dtype).max):.3g} at a "
        f"position no mask removes); {hint}",
        remedies=wider_remedies(name, "smaller_inputs"),
    )


def output_overflow_error(dtype: np.dtype | type) -> NumericalError:
    """The invalid-input error of an output that overflows although its scores and weights are finite: the weights
    sum to 1 (to rounding), so only values within a few ulps of the dtype's largest can give one.
    """
    name = np.dtype(dtype).name
    return not_finite_error(
        f"the attention output overflows {name} (a weighted mean of the values beyond "
        f"{float(np.finfo(dtype).max):.3g}: values within rounding of {name}'s largest)",
        dtype,
    )


def not_finite_error(what: str, dtype: np.dtype | type, extra: str = "") -> NumericalError:
    """The invalid-input error of a gradient (or an output) that is not finite: float64 where it would help, else
    smaller inputs.
    """
    name = np.dtype(dtype).name
    hint = "retry with precision float64 or smaller inputs" if name != "float64" else "use smaller inputs"
    return NumericalError(f"{what}{extra}; {hint}", remedies=wider_remedies(name, "smaller_inputs"))


def _wider(dtype: np.dtype | type) -> str:
    """``"precision float64 or "`` where float64 would help, nothing where it is already in force."""
    return "precision float64 or " if np.dtype(dtype) != np.float64 else ""


@lru_cache(maxsize=256)
def score_factor(scale: float, temperature: float, dtype: np.dtype | type) -> np.floating:
    """``scale / temperature`` (computed in float64), the scalar Q is multiplied by, rounded once to ``dtype``.

    Where the rounded factor would not be a normal number of ``dtype`` (float32 below 1.2e-38: 0 or a
    subnormal with few significant bits), the float64 quotient is returned instead, so that products
    with it are formed in float64 and rounded once: ``scale: 1e-25, temperature: 1e24`` on queries and
    keys of 1e22 gives scores of 1e-5, not 0. A factor that overflows is a :class:`NumericalError`
    (every score would be infinite). Cached (errors are not).
    """
    factor = scale / temperature
    dtype = np.dtype(dtype)
    with np.errstate(over="ignore", under="ignore"):
        rounded: np.floating = dtype.type(factor)
    if not np.isfinite(rounded):
        raise NumericalError(
            f"scale / temperature = {factor:.3g} overflows {dtype.name}; use {_wider(dtype)}a larger temperature",
            remedies=wider_remedies(dtype.name, "larger_temperature"),
        )
    if abs(rounded) < np.finfo(dtype).tiny:
        return np.float64(factor)
    return rounded


def scaled_bias(bias: np.ndarray, temperature: float, dtype: np.dtype | type, *, check: bool = True) -> np.ndarray:
    """A float mask divided by the temperature: divided in float64 and rounded once to ``dtype``.

    ``-inf`` (a masked position) stays ``-inf``. A finite entry whose quotient does not fit ``dtype`` is a
    :class:`NumericalError` (``check``): turning it into ``-inf`` would mask the position, and a row whose
    every entry overflowed would silently become a dead row. With a temperature of 1 and ``bias`` already
    in ``dtype``, ``bias`` itself is returned (dividing by 1 and rounding back change nothing): read it only.
    """
    dtype = np.dtype(dtype)
    if temperature == 1.0 and isinstance(bias, np.ndarray) and bias.dtype == dtype:
        return bias
    with np.errstate(over="ignore", under="ignore"):
        quotient = np.asarray(bias, dtype=np.float64) / float(temperature)
        out = quotient.astype(dtype)
    if check and not np.isfinite(out).all():
        bad = np.isfinite(bias) & ~np.isfinite(out)
        if bad.any():
            idx = np.unravel_index(int(np.flatnonzero(bad)[0]), bad.shape)
            raise NumericalError(
                f"the float mask divided by the temperature overflows {dtype.name} "
                f"(a mask entry / temperature = {float(quotient[idx]):.3g}); "
                f"use {_wider(dtype)}a larger temperature",
                remedies=wider_remedies(dtype.name, "larger_temperature"),
            )
    return out


def check_scores_finite(scores: np.ndarray, keep: np.ndarray | None, dtype: np.dtype | type) -> None:
    """Scores returned to the client must be finite wherever no mask removes the position (``-inf`` = masked)."""
    if np.isfinite(scores).all():
        return
    bad = ~np.isfinite(scores)
    if keep is not None:
        bad &= keep
    if bad.any():
        raise overflow_error(dtype)


def check_live_rows(dead: np.ndarray, valid_keys: np.ndarray, dtype: np.dtype | type) -> None:
    """``dead`` (rows whose scores are all ``-inf``) may only hold rows that every mask removed.

    A row with valid keys whose scores all overflowed to ``-inf`` would otherwise be answered as a
    fully masked row (zeros), silently.
    """
    if dead.any() and (dead & (valid_keys > 0)).any():
        raise overflow_error(dtype)
