"""Plain data types shared by the core maths and the engines."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

Normalizer = Literal["softmax", "sparsemax", "entmax15", "entmax", "relu"]
Causal = Literal["top_left", "bottom_right"]
NORMALIZERS: tuple[str, ...] = ("softmax", "sparsemax", "entmax15", "entmax", "relu")

# Array types where arrays cross module boundaries (wire codecs -> engines -> core maths -> responses).
FloatArray = NDArray[np.floating[Any]]
"""Tensors of numbers: float16, float32 or float64."""
BoolArray = NDArray[np.bool_]
IntArray = NDArray[np.integer[Any]]
MaskArray = NDArray[np.bool_ | np.floating[Any]]
"""A mask: boolean (True = may attend) or floating (additive bias)."""


@dataclass(frozen=True, slots=True)
class AttentionParams:
    """Scalar options of one attention call (docs/concepts/contract.md, "The forward pass").

    ``scale`` None means ``1/sqrt(E)``; ``alpha`` is used by ``entmax`` only;
    ``causal`` None means no causal mask.
    """

    normalizer: str = "softmax"
    alpha: float | None = None
    scale: float | None = None
    temperature: float = 1.0
    causal: Causal | None = None


@dataclass(slots=True)
class AttentionInputs:
    """Tensors of one attention call, ranks 2 to 4 (docs/concepts/contract.md, "Shapes").

    ``mask`` is boolean (True = may attend) or floating (additive), and
    broadcastable to ``(B, Hq, L, S)``; ``key_lengths`` is one int per batch.
    """

    query: FloatArray
    key: FloatArray
    value: FloatArray
    mask: MaskArray | None = None
    key_lengths: IntArray | None = None


@dataclass(slots=True)
class AttentionTask:
    """Everything an engine needs to run one request."""

    inputs: AttentionInputs
    params: AttentionParams = field(default_factory=AttentionParams)
    dtype: np.dtype = field(default_factory=lambda: np.dtype(np.float32))
    need_weights: bool = True
    need_scores: bool = False


@dataclass(slots=True)
class AttentionResult:
    """What an attention call returns.

    ``output`` has the query's rank; ``weights`` and ``scores`` have shape
    ``query.shape[:-1] + (S,)`` and are None unless asked for. ``scores`` are
    the normalizer's input ``(scale*QK^T + bias)/T`` with masked positions
    ``-inf``. ``valid_keys`` is ``(B, Hq, L)``: how many keys each query row
    may attend after all masks (0 for a fully masked row).
    """

    output: FloatArray
    weights: FloatArray | None
    scores: FloatArray | None
    valid_keys: IntArray
