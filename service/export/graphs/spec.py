"""What an exported graph is (:class:`GraphSpec`) and the symbolic shapes its inputs and outputs share."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import onnx

from service.export.builder import GraphBuilder

DTYPES = ("float32", "float64")
CAUSAL_ALIGNMENTS = ["top_left", "bottom_right"]
# Bisection steps of the general entmax graph, which computes in float64 for both dtypes
# (as the numpy reference does): a bracket of width <= 1 shrinks to 2^-64 ~ 5.4e-20.
BISECT_ITERATIONS = 64

Q_SHAPE = ["batch", "q_heads", "q_len", "head_dim"]
K_SHAPE = ["batch", "kv_heads", "kv_len", "head_dim"]
V_SHAPE = ["batch", "kv_heads", "kv_len", "v_head_dim"]
KEEP_SHAPE = ["mask_batch", "mask_heads", "q_len", "kv_len"]
BIAS_SHAPE = ["bias_batch", "bias_heads", "bias_q_len", "bias_kv_len"]
OUT_SHAPE = ["batch", "q_heads", "q_len", "v_head_dim"]
ROW_SHAPE = ["batch", "q_heads", "q_len", "kv_len"]
ROW_STAT_SHAPE: list[str | int] = ["batch", "q_heads", "q_len", 1]


@dataclass(frozen=True)
class GraphSpec:
    """One exported graph: its file stem, how to build it and what it supports."""

    name: str
    dtype: str
    normalizer: str  # softmax | sparsemax | entmax15 | entmax | relu
    fused: bool
    outputs: tuple[str, ...]
    build: Callable[[GraphBuilder], None] = field(repr=False, compare=False)
    description: str = ""
    masked: bool = True  # False: no keep_mask/bias inputs (the Attention kernel then skips the mask)
    backward: bool = False  # True: the backward pass (inputs grad_output, grad_weights; outputs the gradients)
    gqa: bool = True  # False: query heads must equal key heads
    min_q_len: int = 1  # the shortest query the graph is chosen for (shorter ones go to the next graph)

    @property
    def file(self) -> str:
        return f"{self.name}.onnx"

    def supports(self) -> dict[str, Any]:
        """What the manifest says this graph serves (read by the engine to pick a graph)."""
        if self.normalizer == "entmax":
            alpha: Any = "any alpha > 1 (input 'alpha')"
        elif self.normalizer == "sparsemax":
            alpha = 2.0
        elif self.normalizer == "entmax15":
            alpha = 1.5
        else:
            alpha = None
        return {
            "pass": "backward" if self.backward else "forward",
            "normalizer": self.normalizer,
            "entmax_alpha": alpha,
            "dtype": self.dtype,
            "outputs": list(self.outputs),
            "weights": "weights" in self.outputs,
            "scores": "scores" in self.outputs,
            "fused_attention_op": self.fused,
            "masking": self.masked,
            "causal": list(CAUSAL_ALIGNMENTS) if self.masked else [],
            "masks": ["bool", "float", "none"] if self.masked else ["none"],
            "key_lengths": self.masked,
            "gqa": self.gqa,
            "min_q_len": self.min_q_len,
            "scale_input": True,
            "temperature_input": True,
            "fully_masked_rows": (
                "zero by the Attention operator's spec; the engine zeroes them whatever the runtime did"
                if self.fused
                else "zero output and weights, in the graph"
            ),
        }

    def model(self) -> onnx.ModelProto:
        g = GraphBuilder(self.name, self.dtype)
        self.build(g)
        return g.model(self.description)
