"""Which score overflowed, and why: the score itself, or only the products ``q_d * k_d`` that form it.

The engines check their scores where they form them and raise :class:`~.numerics.ScoreOverflow` with a
generic message (the check must stay one cheap pass). A score can be non-finite for two reasons:

- the score ``(scale * q.k + bias) / temperature`` itself is beyond the dtype's range;
- the score is within range, but a term of ``q.k`` (``q_d * k_d``, scaled or not) is not, so the sum
  overflows (``inf - inf`` is NaN) where its terms cancel: ``q = (1e20, 1e20)``, ``k = (1e20, -1e20)``
  has ``q.k = 0``, but each term is 1e40, beyond float32.

:func:`explain_score_overflow` finds the first such position again in a wider type (float64 for
float32; ``long double`` for float64 where it is wider, as on x86-64 Linux) and says which it is,
naming the position and the value: the remedy differs (float64 helps both in float32; in float64 only
smaller inputs do). It runs only after an overflow, so its cost (a few passes per head) does not
matter.
"""

from __future__ import annotations

import numpy as np

from service.core.attention.numerics import ScoreOverflow
from service.core.attention.prepared import Prepared, prepare
from service.core.errors import NumericalError, wider_remedies
from service.core.types import AttentionInputs, AttentionParams

BLOCK_TERMS = 1 << 22
"""Query rows are searched for overflowing terms in blocks of at most this many products (rows x S x E)."""


def _wider(dtype: np.dtype) -> type[np.floating] | None:
    """A float type with a wider exponent range than ``dtype``, or None where the platform has none."""
    if dtype == np.float32:
        return np.float64
    if np.finfo(np.longdouble).max > np.finfo(np.float64).max:
        return np.longdouble
    return None


def _position(p: Prepared, b: int, kv: int, row: int, s: int) -> str:
    """(batch, query head, query row, key) of row ``row`` of kv head ``kv``'s stacked (G * L) rows."""
    g, i = divmod(row, p.dims.L)
    return f"(batch {b}, head {kv * p.dims.group + g}, query {i}, key {s})"


def _shown(x: np.floating) -> str:
    """``x`` to three digits, a ``long double`` beyond float64's range included (``float()`` would make it inf)."""
    value = float(x)
    return f"{value:.3g}" if np.isfinite(value) else np.format_float_scientific(x, precision=2, trim="-")


def _hint(dtype: np.dtype, wider: str, alone: str) -> str:
    """What helps: ``wider`` after "float64 or" where float64 is not in force, else ``alone``."""
    return f"retry with precision float64 or {wider}" if dtype != np.float64 else alone


def _head_keep(p: Prepared, b: int, kv: int, shape: tuple[int, int, int]) -> np.ndarray:
    """The positions no mask removes of kv head ``kv`` of batch ``b``, as (G, L, S)."""
    if p.drop5 is None:
        return np.ones(shape, dtype=bool)
    drop = p.drop5[min(b, p.drop5.shape[0] - 1), min(kv, p.drop5.shape[1] - 1)]
    return np.broadcast_to(~drop, shape)


def explain_overflow(p: Prepared) -> NumericalError | None:
    """The error naming the first score of ``p`` (no relu) that overflows its dtype, or the first whose
    products do; None when neither is found (or no wider type exists to look with).
    """
    dtype = p.q.dtype
    wide = _wider(dtype)
    if wide is None:
        return None
    name, largest = dtype.name, float(np.finfo(dtype).max)
    d = p.dims
    factor = wide(p.factor)
    growth = max(1.0, abs(float(p.factor)))  # a term may be formed with the factor or without it
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        for b in range(d.B):
            for kv in range(d.Hkv):
                q = p.q5[b, kv].reshape(d.group * d.L, d.E).astype(wide)
                k = p.k[b, kv].astype(wide)
                z = (q * factor) @ k.T
                keep = _head_keep(p, b, kv, (d.group, d.L, d.S)).reshape(z.shape)
                if p.bias5 is not None:
                    bias = p.bias5[min(b, p.bias5.shape[0] - 1), min(kv, p.bias5.shape[1] - 1)]
                    z += np.broadcast_to(bias, (d.group, d.L, d.S)).reshape(z.shape).astype(wide)
                over = keep & ~np.isfinite(z.astype(dtype))
                if over.any():
                    row, s = np.unravel_index(int(np.flatnonzero(over)[0]), over.shape)
                    return NumericalError(
                        f"the scores overflow {name}: the score (scale * q.k + bias) / temperature at "
                        f"{_position(p, b, kv, int(row), int(s))} is {_shown(z[row, s])}, beyond {largest:.3g}; "
                        f"{_hint(dtype, 'smaller inputs', 'use smaller inputs')}",
                        remedies=wider_remedies(name, "smaller_inputs"),
                    )
                step = max(1, BLOCK_TERMS // max(1, d.S * d.E))
                for start in range(0, q.shape[0], step):
                    terms = np.abs(q[start : start + step, None, :] * k[None, :, :]).max(axis=-1) * growth
                    bad = keep[start : start + step] & (terms > largest)
                    if bad.any():
                        row, s = np.unravel_index(int(np.flatnonzero(bad)[0]), bad.shape)
                        row += start
                        return NumericalError(
                            f"the scores fit {name}, but the products forming them overflow it: at "
                            f"{_position(p, b, kv, int(row), int(s))} the score is {_shown(z[row, s])}, while "
                            f"a term q[d] * k[d] of q.k reaches {_shown(terms[row - start, s])} (beyond "
                            f"{largest:.3g}); {_hint(dtype, *['scale the queries or keys down'] * 2)}",
                            remedies=wider_remedies(name, "smaller_inputs"),
                        )
    return None


def explain_score_overflow(
    error: ScoreOverflow, inputs: AttentionInputs, params: AttentionParams, dtype: np.dtype | type
) -> NumericalError:
    """``error`` with its cause and position (:func:`explain_overflow`), or ``error`` itself where relu formed the
    scores (in float64, without the temperature) or the cause is not found.
    """
    if params.normalizer == "relu":
        return error
    try:
        p = prepare(inputs, params, np.dtype(dtype))
    except (NumericalError, ValueError):
        return error
    return explain_overflow(p) or error
