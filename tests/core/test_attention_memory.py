"""The numpy engine's output-only path never holds the ``(L, S)`` scores (issue 32 item 1): it works on chunks of
query rows of at most ``CHUNK_ELEMENTS`` scores per thread, so its working memory beyond the inputs and the output
does not grow with ``L x S`` (numpy reports its allocations to ``tracemalloc``).
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from service.core.attention import attention
from service.core.attention.chunks import CHUNK_ELEMENTS


def peak_bytes(length: int, need_weights: bool) -> tuple[int, int]:
    """(peak bytes allocated during one call, the output's bytes) for a (1, 2, length, 16) float32 request."""
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 2, length, 16), dtype=np.float32) for _ in range(3))
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        result = attention(q, k, v, need_weights=need_weights, dtype=np.float32)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak, result.output.nbytes


@pytest.mark.parametrize("length", [1024, 4096])
def test_output_only_working_memory_does_not_grow_with_the_scores(length: int) -> None:
    peak, output = peak_bytes(length, need_weights=False)
    scores = 2 * length * length * 4
    # the output, the query scaled once (its size), and a chunk of scores with two float temporaries per chunk
    bound = 2 * output + 4 * CHUNK_ELEMENTS * 4 + (1 << 20)
    assert peak <= bound, (peak, bound, scores)
    if length == 4096:
        assert scores > 10 * bound  # the scores alone (134 MB) would be far over it


def test_with_weights_the_weights_are_the_memory() -> None:
    """The control: asking for the weights holds them, so the measurement sees an (L, S) array when there is one."""
    peak, _ = peak_bytes(1024, need_weights=True)
    assert peak >= 2 * 1024 * 1024 * 4
