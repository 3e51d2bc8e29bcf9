"""The options of steps 2-7 and their ranges."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from service.core.errors import InvalidInput

MAX_TOP_LOGPROBS = 20

TokenLists = Sequence[int] | Sequence[Sequence[int]] | np.ndarray


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """The options of steps 2-7; the defaults leave the softmax unchanged."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0


def check_params(params: SamplingParams) -> None:
    """Reject options outside their ranges (docs/concepts/fixed-names.md), naming the field."""
    checks = (
        ("temperature", math.isfinite(params.temperature) and params.temperature >= 0, "must be a finite number >= 0"),
        ("top_k", params.top_k >= 0, "must be an integer >= 0 (0 = off)"),
        ("top_p", 0 < params.top_p <= 1, "must be in (0, 1]"),
        ("min_p", 0 <= params.min_p < 1, "must be in [0, 1)"),
        (
            "repetition_penalty",
            math.isfinite(params.repetition_penalty) and params.repetition_penalty > 0,
            "must be a finite number > 0",
        ),
        ("presence_penalty", math.isfinite(params.presence_penalty), "must be a finite number"),
        ("frequency_penalty", math.isfinite(params.frequency_penalty), "must be a finite number"),
    )
    for name, ok, msg in checks:
        if not ok:
            raise InvalidInput(f"{name} {msg}", (name,))
