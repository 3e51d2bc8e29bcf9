"""The numpy engine: the reference implementation, every feature, float32 and float64."""

from __future__ import annotations

from typing import Any

import numpy as np

from service.core.attention import run_attention
from service.core.types import AttentionResult, AttentionTask


class NumpyEngine:
    """Runs :func:`service.core.attention.run_attention` in-process.

    Supports every request the contract defines, so it is the fallback of
    ``engine: "auto"``.
    """

    name = "numpy"

    @property
    def provider(self) -> str:
        return "CPU/numpy"

    @property
    def ready(self) -> bool:
        return True

    def unsupported_reason(self, task: AttentionTask) -> str | None:
        return None

    def run(self, task: AttentionTask) -> AttentionResult:
        return run_attention(task)

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "provider": self.provider,
            "ready": True,
            "numpy_version": np.__version__,
            "supports": "every normalizer, mask, causal alignment, float32 and float64",
        }
