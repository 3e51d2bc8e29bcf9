"""Scaled dot-product attention with pluggable normalizers, on numpy (docs/concepts/contract.md, "The forward pass").

The pipeline, in order: ``scores = scale * Q K^T``, add the mask bias (booleans select, floats add),
divide by the temperature, normalize over the key axis, ``output = A V``. The backward pass
(:mod:`service.core.backward`) and the analysis sweep (:mod:`service.core.analysis`) run on the same
prepared calls and chunks.

Layout:

- ``checks``: shapes (:class:`Dims`, :func:`check_dims`) and options (:func:`check_params`, :func:`resolved_scale`).
- ``numerics``: ``scale / T`` and ``bias / T`` rounded once, and the refusals of scores that overflow.
- ``prepared``: one call validated, cast, masks combined and heads grouped (:class:`~.prepared.Prepared`).
- ``chunks``: chunks of query rows, run on threads, and the scores of a chunk (shared with the backward pass).
- ``forward``: :func:`run_attention` and :func:`attention`, the one-pass and chunked forward paths.
- ``overflow``: which score overflowed and why (the score, or only the products forming it), after the fact.
"""

from __future__ import annotations

from service.core.attention.checks import (
    COMPUTE_DTYPES,
    Dims,
    check_dims,
    check_params,
    promote_to_4d,
    resolved_scale,
)
from service.core.attention.forward import attention, run_attention
from service.core.attention.numerics import (
    ScoreOverflow,
    check_live_rows,
    check_scores_finite,
    not_finite_error,
    output_overflow_error,
    overflow_error,
    scaled_bias,
    score_factor,
    widened_factor,
)
from service.core.attention.overflow import explain_score_overflow

__all__ = [
    "COMPUTE_DTYPES",
    "Dims",
    "ScoreOverflow",
    "attention",
    "check_dims",
    "check_live_rows",
    "check_params",
    "check_scores_finite",
    "explain_score_overflow",
    "not_finite_error",
    "output_overflow_error",
    "overflow_error",
    "promote_to_4d",
    "resolved_scale",
    "run_attention",
    "scaled_bias",
    "score_factor",
    "widened_factor",
]
