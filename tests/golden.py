"""Loading the golden cases computed by PyTorch, the entmax package and Hugging Face's warpers (tests/golden/)."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from service.core.types import AttentionInputs, AttentionParams, AttentionTask

GOLDEN_DIR = Path(__file__).resolve().parent / "golden"
"""The reference cases, kept in the repository (tests/golden/README.md says where they come from)."""


@cache
def load(name: str) -> list[dict[str, Any]]:
    """The cases of ``golden/<name>.json``."""
    with open(GOLDEN_DIR / f"{name}.json") as f:
        return json.load(f)["cases"]


def tolerance(request: dict[str, Any]) -> float:
    """The file's stated tolerance: 1e-8 in float64, 1e-6 for bisection entmax."""
    return 1e-6 if request.get("normalizer") == "entmax" else 1e-8


def task_from_request(request: dict[str, Any], *, need_weights: bool = True) -> AttentionTask:
    """A core task from a /v1/attention request body in the nested-array form."""
    causal = request.get("causal", False)
    mask = request.get("mask")
    return AttentionTask(
        inputs=AttentionInputs(
            query=np.array(request["query"], dtype=np.float64),
            key=np.array(request["key"], dtype=np.float64),
            value=np.array(request["value"], dtype=np.float64),
            mask=None if mask is None else np.array(mask),
            key_lengths=None if request.get("key_lengths") is None else np.array(request["key_lengths"]),
        ),
        params=AttentionParams(
            normalizer=request.get("normalizer", "softmax"),
            alpha=request.get("alpha"),
            scale=request.get("scale"),
            temperature=request.get("temperature", 1.0),
            causal="top_left" if causal is True else (causal or None),
        ),
        dtype=np.dtype(request.get("precision", "float32")),
        need_weights=need_weights,
    )
