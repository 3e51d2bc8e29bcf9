"""Which graph of the manifest serves a request: by normalizer, dtype, outputs needed and masking."""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from service.core.types import AttentionTask

SUPPORTED_DTYPES = ("float32", "float64")


class RequestKey(NamedTuple):
    """What picks a graph for a request."""

    normalizer: str
    """The graph's normalizer (entmax at alpha 1.5 and 2 is entmax15 and sparsemax)."""
    dtype: str
    outputs: set[str]
    """The outputs needed."""
    masked: bool
    """Whether anything masks (a mask, causal, key lengths)."""
    grouped: bool
    """Whether query heads share key heads (GQA)."""
    q_len: int
    """The query's rows (a graph may serve only queries of at least ``min_q_len``)."""


def request_key(task: AttentionTask) -> RequestKey | str:
    """The :class:`RequestKey` of ``task``, or the reason no graph can serve it."""
    dtype = np.dtype(task.dtype).name
    if dtype not in SUPPORTED_DTYPES:
        return f"precision {dtype} has no ONNX graph (float32 and float64 only)"
    normalizer = task.params.normalizer
    if normalizer == "entmax":
        alpha = task.params.alpha
        if alpha is None or not math.isfinite(alpha) or alpha <= 1:
            return f"entmax needs a finite alpha > 1, got {alpha}"
        # the exact sort-based graphs, as the numpy reference does for these two alphas
        normalizer = {2.0: "sparsemax", 1.5: "entmax15"}.get(float(alpha), "entmax")
    outputs = {"output"}
    if task.need_weights:
        outputs.add("weights")
    if task.need_scores:
        outputs.add("scores")
    inputs = task.inputs
    masked = inputs.mask is not None or task.params.causal is not None or inputs.key_lengths is not None
    q_shape, k_shape = inputs.query.shape, inputs.key.shape
    grouped = len(q_shape) == 4 and len(k_shape) == 4 and q_shape[1] != k_shape[1]
    q_len = q_shape[-2] if len(q_shape) >= 2 else 1
    return RequestKey(normalizer, dtype, outputs, masked, grouped, q_len)


def forward_graph(graphs: list[dict[str, Any]], key: RequestKey) -> str | None:
    """The first forward graph of ``graphs`` (manifest entries, in order of preference) that serves ``key``."""
    for g in graphs:
        s = g["supports"]
        if (
            s.get("pass", "forward") == "forward"
            and s["normalizer"] == key.normalizer
            and s["dtype"] == key.dtype
            and key.outputs <= set(s["outputs"])
            and (s["masking"] or not key.masked)
            and (s.get("gqa", True) or not key.grouped)
            and key.q_len >= s.get("min_q_len", 1)
        ):
            name: str = g["name"]
            return name
    return None


def backward_graph(graphs: list[dict[str, Any]], key: RequestKey) -> str | None:
    """The backward graph of ``graphs`` for the normalizer and dtype of ``key``."""
    for g in graphs:
        s = g["supports"]
        if s.get("pass") == "backward" and s["normalizer"] == key.normalizer and s["dtype"] == key.dtype:
            return str(g["name"])
    return None
