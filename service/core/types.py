"""Plain data types shared by the core maths and the engines."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

Normalizer = Literal["softmax", "sparsemax", "entmax15", "entmax", "relu"]
Causal = Literal["top_left", "bottom_right"]
NORMALIZERS: tuple[str, ...] = ("softmax", "sparsemax", "entmax15", "entmax", "relu")


@dataclass(frozen=True, slots=True)
class AttentionParams:
    """Scalar options of one attention call (semantics.md, "Pipeline").

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
    """Tensors of one attention call, ranks 2 to 4 (semantics.md, "Shapes").

    ``mask`` is boolean (True = may attend) or floating (additive), and
    broadcastable to ``(B, Hq, L, S)``; ``key_lengths`` is one int per batch.
    """

    query: np.ndarray
    key: np.ndarray
    value: np.ndarray
    mask: np.ndarray | None = None
    key_lengths: np.ndarray | None = None


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

    output: np.ndarray
    weights: np.ndarray | None
    scores: np.ndarray | None
    valid_keys: np.ndarray
