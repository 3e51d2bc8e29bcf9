"""The attention graphs written to models/, built with ``onnx.helper``.

Every graph has these inputs (``softmax_fused_nomask_*`` lacks keep_mask and
bias), so that one session serves every value of the masks, key lengths, scale
and temperature:

============  =====================================  ==========================================
input         shape                                  meaning
============  =====================================  ==========================================
query         (batch, q_heads, q_len, head_dim)      Q, rank 4 (the engine promotes ranks 2, 3)
key           (batch, kv_heads, kv_len, head_dim)    K; q_heads % kv_heads == 0 (GQA, h -> h // G)
value         (batch, kv_heads, kv_len, v_head_dim)  V
keep_mask     (mask_batch, mask_heads, q_len, kv_len) bool, True = may attend; mask_batch in {1, batch},
                                                      mask_heads in {1, q_heads}. The engine builds it
                                                      from the boolean mask, causal (either alignment),
                                                      key_lengths and the -inf entries of a float mask.
bias          (bias_batch, bias_heads, bias_q_len,   additive float mask, broadcastable to
               bias_kv_len)                           (batch, q_heads, q_len, kv_len); (1,1,1,1) zeros if none
scale         ()                                     multiplies Q K^T (float64 in the relu graphs)
temperature   ()                                     divides the biased scores (float64 in the relu graphs;
                                                      the engine feeds the others scale/T and 1)
alpha         ()                                     entmax graphs only: alpha > 1
============  =====================================  ==========================================

and computes the forward pass of docs/concepts/contract.md: ``z = (scale Q K^T + bias) / T`` with
``-inf`` where ``keep_mask`` is False (by ``Where``: selection, never a
finite sentinel), a normalizer over the key axis, ``output = A V``. A fully
masked row gives zero weights and a zero output (inside the primitive graphs;
by the Attention operator's own spec in the fused ones, and the engine checks).

Two families:

- ``softmax_fused_*``: the ONNX ``Attention`` operator (opset 23), which ONNX
  Runtime runs as one kernel. Q is pre-multiplied by ``scale / T`` and the
  operator's own ``scale`` is 1; the mask is passed as a float bias holding
  ``-inf`` (never the boolean form, which some runtimes turn into -10000).
  ``softmax_fused_{dtype}`` returns only the output (the weights are never
  materialised as a graph output); ``softmax_fused_weights_{dtype}`` adds the
  weights (``qk_matmul_output_mode = 3``); ``softmax_fused_nomask_{dtype}``
  serves unmasked requests without the mask inputs. ONNX Runtime's CPU provider has
  Attention kernels for float32 and float16 only: for float64 it expands the
  operator's function body into primitive operators, with the same results.
- primitive graphs (MatMul, Add, Where, Softmax, TopK, CumSum, ...), one per
  normalizer and dtype, returning output, weights and the scores (the
  normalizer's input, ``-inf`` where masked). ONNX Runtime runs every node
  whichever outputs are fetched, and these normalizers materialise the weights
  anyway, so one variant serves all requests; the scores cost one extra pass
  only in the softmax graph, which the engine uses only when scores are asked for.

Layout:

- ``spec``: :class:`GraphSpec` (one exported graph and what it supports) and the shared symbolic shapes.
- ``common``: the inputs every graph declares, ``Q * scale / T``, the mask bias, rows without a key.
- ``fused``: the softmax graphs on the ONNX ``Attention`` operator.
- ``normalizers``: sparsemax, entmax15, alpha-entmax (bisection) and relu as subgraphs.
- ``primitive``: the primitive-operator graphs, one per normalizer and dtype (relu's in float64).
- ``backward``: softmax attention with its backward pass.
- ``registry``: :data:`GRAPHS`, every graph in manifest order, and :func:`dtype_tag`.
"""

from __future__ import annotations

from service.export.builder import IR_VERSION, OPSET
from service.export.graphs.registry import GRAPHS, dtype_tag
from service.export.graphs.spec import BISECT_ITERATIONS, GraphSpec

__all__ = ["BISECT_ITERATIONS", "GRAPHS", "GraphSpec", "IR_VERSION", "OPSET", "dtype_tag"]
