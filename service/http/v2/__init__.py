"""The Open Inference Protocol over REST, under /v2 (the data plane's models on the protocol's JSON and binary forms).

- ``routes``: server and model metadata, health, and inference;
- ``tensors``: the inference request and response bodies (JSON ``data`` and the binary tensor data extension);
- ``checks``: what JSON ``data`` must satisfy beyond its values' types (its nesting, the FP16 and FP32 range);
- ``schemas``: the protocol's objects, for the OpenAPI schema.
"""
