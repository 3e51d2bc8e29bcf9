"""The option values of the API (docs/concepts/fixed-names.md) as ``Literal`` types: a type checker catches a typo."""

from __future__ import annotations

from typing import Literal

__all__ = [
    "AttentionReturn",
    "BackwardReturn",
    "Causal",
    "Distribution",
    "EngineName",
    "HeadFusion",
    "Normalizer",
    "Precision",
    "SampleReturn",
    "SessionReturn",
]

Normalizer = Literal["softmax", "sparsemax", "entmax15", "entmax", "relu"]
"""``entmax`` needs ``alpha > 1`` (2 is sparsemax, 1.5 is entmax15)."""
EngineName = Literal["auto", "numpy", "onnx"]
Precision = Literal["float32", "float64"]
Causal = bool | Literal["top_left", "bottom_right"]
"""``True`` means ``"top_left"`` (PyTorch ``is_causal``); ``"bottom_right"`` aligns the last query with the last key."""
AttentionReturn = Literal["output", "weights", "scores", "diagnostics", "gradient_health", "inspection", "norm_weights"]
BackwardReturn = Literal[
    "grad_query",
    "grad_key",
    "grad_value",
    "grad_mask",
    "grad_scale",
    "grad_temperature",
    "output",
    "weights",
    "gradient_health",
    "head_importance",
]
SessionReturn = Literal["output", "weights", "diagnostics"]
"""What a session's step can send back (no ``scores``: a step's row is the whole kept cache)."""
SampleReturn = Literal["tokens", "logprobs", "raw_logprobs", "top_logprobs", "probabilities", "diagnostics"]
Distribution = Literal["normal"]
HeadFusion = Literal["mean", "max", "min"]
"""How ``rollout`` fuses each layer's heads (with ``gradients``, ``"mean"`` only)."""
CalibrationMethod = Literal["temperature"]
