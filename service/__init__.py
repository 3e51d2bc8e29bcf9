"""Attention inference microservice.

- ``core``: the maths, pure numpy (attention, backward, normalizers, diagnostics, sampling, calibration);
- ``engines``: numpy and ONNX Runtime behind one protocol, the dispatcher that picks one, cost models;
- ``dataplane``: the operations on arrays and typed options, models, admission, budgets, scheduling;
- ``http``: the REST front end (``/v1`` JSON, ``/v2`` Open Inference Protocol), its edge and pages;
- ``grpc``: the gRPC front end (the Open Inference Protocol's ``GRPCInferenceService``, health, reflection);
- ``export``: the ONNX graph builder (``models/``);
- ``observability``: metrics, logs, spans; ``cli``: the command line; ``app``: :func:`service.app.create_app`
  wires the parts; ``settings``: every ``ATTN_*`` setting (one class, composed of one per concern).
"""

__version__ = "0.1.0"
