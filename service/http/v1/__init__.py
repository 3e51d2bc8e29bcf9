"""The JSON API under /v1: the contract's fields in, the contract's fields out.

- ``attention``: ``/v1/attention``, ``/v1/attention/backward``, ``/v1/attention/analyze``;
- ``logits``: ``/v1/softmax``, ``/v1/sample``, ``/v1/calibrate``;
- ``rollout``: ``/v1/attention/rollout`` (attention rollout across layers);
- ``common``: body validation, tensor decoding and the scheduling every route shares;
- ``schemas``, ``gradient_schemas``, ``logits_schemas``, ``rollout_schemas``: the request and response models (the
  OpenAPI schema).
"""
