"""The fused softmax graphs: one ONNX ``Attention`` node (opset 23), which ONNX Runtime runs as one kernel; and the
flash graph, one ``com.microsoft.MultiHeadAttention`` node, which ONNX Runtime runs tiled on the CPU.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from service.export.builder import CONTRIB_DOMAIN, GraphBuilder
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


def build_flash(g: GraphBuilder) -> None:
    """Softmax attention, output only, no masks, on ONNX Runtime's ``MultiHeadAttention`` contributed operator.

    On the CPU, in float32 and without masks, bias or past keys, ONNX Runtime runs it as FlashAttention (Dao et al.
    2022; onnxruntime PR #20805, MLAS ``MlasFlashAttention``): blocks of keys with an online softmax (a running
    maximum and sum per row), so the ``(L, S)`` scores are never held; its working memory is a few tiles per thread.
    The operator's ``num_heads`` is an attribute, fixed at export, while requests bring any number of heads: the
    heads are folded into the batch, ``(B, H, L, E) -> (B * H, L, E)`` (a reshape, no copy), and the node runs with
    one head. The query is scaled by ``scale / T`` first (``scale=1`` on the node), as the other graphs do. Query and
    key heads must be equal (the engine sends grouped-query requests to another graph).
    """
    ins = declare_inputs(g, masked=False)
    q = scaled_query(g, ins)
    minus_one = g.const([-1], np.int64)

    def folded(x: str, name: str) -> str:
        rows_and_features = g.op("Shape", x, start=2)
        shape = g.op("Concat", minus_one, rows_and_features, axis=0, out=f"{name}_folded_shape")
        return g.op("Reshape", x, shape, out=f"{name}_folded")

    out = g.op(
        "MultiHeadAttention",
        folded(q, "query"),
        folded(ins.key, "key"),
        folded(ins.value, "value"),
        out="output_folded",
        domain=CONTRIB_DOMAIN,
        num_heads=1,
        scale=1.0,
    )
    lead = g.op("Shape", ins.query, start=0, end=3)
    g.op("Reshape", out, g.op("Concat", lead, minus_one, axis=0, out="output_shape"), out="output")
    g.output("output", OUT_SHAPE, "A V (no masks: no row is fully masked)")
