"""The forward graph's outputs turned into an :class:`~service.core.types.AttentionResult`, the contract checked.

Overflow is invalid input on both engines alike (never a silent dead row or a null score), and fully
masked rows are all zeros whatever the runtime did.
"""

from __future__ import annotations

import numpy as np

from service.core.attention import Dims, check_live_rows, check_scores_finite, output_overflow_error, overflow_error
from service.core.types import AttentionResult, AttentionTask


def forward_result(
    task: AttentionTask,
    fetched: dict[str, np.ndarray],
    dims: Dims,
    keep: np.ndarray | None,
    valid_keys: np.ndarray,
) -> AttentionResult:
    """The answer to ``task`` from the graph's outputs ``fetched`` (``output``, and ``weights``, ``scores`` if run)."""
    dtype = np.dtype(task.dtype)
    S = dims.S
    inputs = task.inputs
    relu = task.params.normalizer == "relu"
    output = fetched["output"]
    weights = fetched.get("weights")
    scores = fetched.get("scores")

    # Overflow is invalid input on both engines alike, never a silent dead row or a null score.
    if scores is not None:
        check_scores_finite(scores, keep, dtype)
    if weights is not None and not relu:  # a live row's weights sum to 1; relu rows may be all 0
        check_live_rows(weights.sum(axis=-1) == 0, valid_keys, dtype)
    # The contract, whatever the runtime did: fully masked rows are all zeros.
    empty = valid_keys == 0
    if empty.any():
        output[empty] = 0
        if weights is not None:
            weights[empty] = 0
    if not np.isfinite(output).all():  # as the numpy engine: NaN from scores that overflowed, else the output itself
        if np.isnan(output).any():
            raise overflow_error(dtype, "the attention output is not finite: the scores")
        raise output_overflow_error(dtype)
    if not task.need_weights:
        weights = None
    lead = inputs.query.shape[:-1]
    rank = inputs.query.ndim
    return AttentionResult(
        output=output.reshape(lead + (dims.Ev,)) if rank < 4 else output,
        weights=None if weights is None else weights.reshape(lead + (S,)),
        scores=None if scores is None else scores.reshape(lead + (S,)),
        valid_keys=valid_keys,
    )
