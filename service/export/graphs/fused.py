"""The fused softmax graphs: one ONNX ``Attention`` node (opset 23), which ONNX Runtime runs as one kernel."""

from __future__ import annotations

from typing import Any

from service.export.builder import GraphBuilder
from service.export.graphs.common import declare_inputs, scaled_query, scaled_query_and_mask_bias
from service.export.graphs.spec import OUT_SHAPE, ROW_SHAPE


def build_fused(g: GraphBuilder, *, weights: bool, masked: bool = True) -> None:
    """One Attention node and nothing over (B, Hq, L, *) around it.

    Fully masked rows are left to the operator, whose spec (opset 23 with its
    errata) makes them zero; runtimes that use a finite sentinel instead return
    the mean of V there, which the engine zeroes (it knows the rows from the keep
    mask). A guard in the graph would cost a pass over the weights.

    ``masked=False`` drops the mask inputs: ONNX Runtime's kernel then skips
    copying the (q_len, kv_len) mask into every head's scores (about 10% of the
    time on (4, 12, 512, 64)), which is what unmasked requests get.

    onnx's shape inference gives ``qk_matmul_output`` a last dim of 0 when kv_len
    is symbolic, so ONNX Runtime logs a shape warning on every run of the weights
    variant; the engine runs that session at log level error. Reshaping to the
    runtime shape would silence it at the price of copying the weights.
    """
    ins = declare_inputs(g, masked=masked)
    if masked:
        q, mask_bias = scaled_query_and_mask_bias(g, ins)
        operands = [q, ins.key, ins.value, mask_bias]
    else:
        operands = [scaled_query(g, ins), ins.key, ins.value]
    outs = ["output", "", "", "weights"] if weights else "output"
    extra: dict[str, Any] = {"qk_matmul_output_mode": 3} if weights else {}
    g.op("Attention", *operands, out=outs, scale=1.0, **extra)
    g.output("output", OUT_SHAPE, "A V; fully masked rows zero per the operator's spec")
    if weights:
        g.output("weights", ROW_SHAPE, "attention weights (softmax), 0 where masked")
