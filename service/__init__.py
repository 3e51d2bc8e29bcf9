"""Attention inference microservice.

The maths lives in :mod:`service.core` (pure numpy), the engines that run it in
:mod:`service.engines`, the ONNX graph builder in :mod:`service.export`, and the
HTTP layer in :mod:`service.api`; :func:`service.app.create_app` wires them.
"""

__version__ = "0.1.0"
