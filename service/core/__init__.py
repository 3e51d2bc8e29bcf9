"""Pure numpy attention maths: normalizers, masks, attention and diagnostics.

Nothing in this package imports FastAPI or Pydantic; it is usable as a library.

Layout:

- ``types``: the plain data types shared by the core and the engines (tasks, parameters, results).
- ``errors``: :class:`~.errors.InvalidInput` and :class:`~.errors.NumericalError`, with the field they concern.
- ``masks``: boolean, additive, causal and key-padding masks, combined by selection.
- ``normalizers``: softmax, sparsemax, entmax15, alpha-entmax, relu and their vector-Jacobian products.
- ``attention``: the forward pass (checks, prepared calls, chunks of query rows, the one-pass and chunked paths).
- ``backward``: the backward pass on the same chunks, and the normalizer Jacobians' norms.
- ``analysis``: the scale / temperature sweep of /v1/attention/analyze.
- ``diagnostics``: per-row, per-head and numerical-health diagnostics of attention weights and probabilities.
- ``probabilities``: a logits tensor normalized along one axis (/v1/softmax).
- ``sampling``: logits post-processing and seeded draws (/v1/sample).
- ``calibration``: temperature scaling and the reliability of predictions (/v1/calibrate).
- ``rollout``: attention rollout across layers and its gradient-weighted form (/v1/attention/rollout).
"""
