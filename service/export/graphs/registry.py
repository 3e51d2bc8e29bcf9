"""Every exported graph, in manifest order (:data:`GRAPHS`): the fused softmax ones, one primitive graph per
normalizer and dtype, and the softmax backward graphs.
"""

from __future__ import annotations

from functools import partial

from service.export.builder import OPSET
from service.export.graphs.backward import BACKWARD_OUTPUTS, build_softmax_backward
from service.export.graphs.fused import build_flash, build_fused
from service.export.graphs.primitive import build_primitive, build_relu
from service.export.graphs.spec import BISECT_ITERATIONS, DTYPES, GraphSpec

FLASH_MIN_Q_LEN = 16
"""Queries shorter than this go to the Attention operator's graph: the flash kernel parallelises over blocks of query
rows, and a decoding step's one row per head leaves it one slow block a head (measured in
docs/benchmarks/engines.md)."""


def _specs() -> list[GraphSpec]:
    specs: list[GraphSpec] = [
        GraphSpec(
            name="softmax_flash_f32",
            dtype="float32",
            normalizer="softmax",
            fused=True,
            outputs=("output",),
            build=build_flash,
            masked=False,
            gqa=False,
            min_q_len=FLASH_MIN_Q_LEN,
            description="Softmax attention on ONNX Runtime's MultiHeadAttention operator (com.microsoft), float32, "
            "output only, no mask inputs, query heads equal to key heads: FlashAttention on the CPU, the scores "
            "never held.",
        )
    ]
    for dtype in DTYPES:
        specs.append(
            GraphSpec(
                name=f"softmax_fused_nomask_{dtype_tag(dtype)}",
                dtype=dtype,
                normalizer="softmax",
                fused=True,
                outputs=("output",),
                build=lambda g: build_fused(g, weights=False, masked=False),
                masked=False,
                description=f"Softmax attention on the ONNX Attention operator (opset {OPSET}), {dtype}, output only, "
                "no mask inputs (requests without mask, causal or key_lengths).",
            )
        )
        specs.append(
            GraphSpec(
                name=f"softmax_fused_{dtype_tag(dtype)}",
                dtype=dtype,
                normalizer="softmax",
                fused=True,
                outputs=("output",),
                build=lambda g: build_fused(g, weights=False),
                description=f"Softmax attention on the ONNX Attention operator (opset {OPSET}), {dtype}, output only.",
            )
        )
        specs.append(
            GraphSpec(
                name=f"softmax_fused_weights_{dtype_tag(dtype)}",
                dtype=dtype,
                normalizer="softmax",
                fused=True,
                outputs=("output", "weights"),
                build=lambda g: build_fused(g, weights=True),
                description=f"Softmax attention on the ONNX Attention operator (opset {OPSET}), {dtype}, "
                "output and weights.",
            )
        )
    for normalizer in ("softmax", "sparsemax", "entmax15", "entmax", "relu"):
        for dtype in DTYPES:
            specs.append(
                GraphSpec(
                    name=f"{normalizer}_{dtype_tag(dtype)}",
                    dtype=dtype,
                    normalizer=normalizer,
                    fused=False,
                    outputs=("output", "weights", "scores"),
                    build=build_relu if normalizer == "relu" else partial(build_primitive, normalizer=normalizer),
                    description=(
                        f"{normalizer} attention from primitive ONNX operators, {dtype}: output, weights and scores"
                        + (
                            f"; alpha is an input, {BISECT_ITERATIONS} bisection steps in float64"
                            if normalizer == "entmax"
                            else ""
                        )
                        + (
                            "; computed in float64 with float64 scale and temperature inputs, the temperature "
                            "left out of the weights (relu is invariant to it)"
                            if normalizer == "relu"
                            else ""
                        )
                        + "."
                    ),
                )
            )
    for dtype in DTYPES:
        specs.append(
            GraphSpec(
                name=f"softmax_backward_{dtype_tag(dtype)}",
                dtype=dtype,
                normalizer="softmax",
                fused=False,
                outputs=BACKWARD_OUTPUTS,
                build=build_softmax_backward,
                backward=True,
                description=f"Softmax attention and its backward pass from primitive ONNX operators, {dtype}: "
                "the gradients of query, key and value, and output, weights, scores and their gradient.",
            )
        )
    return specs


def dtype_tag(dtype: str) -> str:
    """``float32`` -> ``f32``."""
    return {"float32": "f32", "float64": "f64"}[dtype]


GRAPHS: tuple[GraphSpec, ...] = tuple(_specs())
