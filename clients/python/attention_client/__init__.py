"""Python client for the attention service (sync and async): numpy in, numpy out.

Tensors travel in the ``b64`` wire form both ways (little-endian C order), answers are
not compressed unless asked (``compression=True``), 503/429 and connection failures are
retried with backoff honouring ``Retry-After`` (:class:`RetryPolicy`), and every failure
is a :class:`ServiceError` carrying the problem+json fields; input the client can tell is
bad (a ragged list, text for numbers) raises :class:`ValidationError` before any request::

    import numpy as np
    from attention_client import AttentionClient

    with AttentionClient("http://127.0.0.1:8000") as client:  # or "127.0.0.1:8000"
        r = client.attention(q, k, v, causal="top_left", normalizer="entmax15")
        r.output, r.weights, r.diagnostics["entropy"], r.engine.name, r.request_id

``AsyncAttentionClient`` is the same client for ``asyncio`` (``client.py`` is generated from
``async_client.py``). ``help(AttentionClient.attention)`` documents every parameter.
"""

from __future__ import annotations

from attention_client._common import API_KEY_ENV, DEFAULT_URL
from attention_client._version import __version__
from attention_client._wire import decode_tensor, encode_tensor
from attention_client.async_client import AsyncAttentionClient
from attention_client.client import AttentionClient
from attention_client.errors import (
    AuthenticationError,
    OverloadedError,
    PayloadTooLargeError,
    ServerTimeoutError,
    ServiceError,
    TransportError,
    ValidationError,
)
from attention_client.results import (
    AnalyzeResult,
    AttentionDiagnostics,
    AttentionResult,
    BackwardResult,
    CalibrateResult,
    DefaultAttentionResult,
    DefaultBackwardResult,
    DefaultSampleResult,
    EngineInfo,
    GradientHealth,
    HeadDiagnostics,
    HeadGradientHealth,
    ReliabilityBin,
    SampleDiagnostics,
    SampleResult,
    ScoreStats,
    SoftmaxDiagnostics,
    SoftmaxResult,
    SweepRow,
    TokenLogprob,
)
from attention_client.retry import RetryPolicy

__all__ = [
    "API_KEY_ENV",
    "DEFAULT_URL",
    "AnalyzeResult",
    "AsyncAttentionClient",
    "AttentionClient",
    "AttentionDiagnostics",
    "AttentionResult",
    "AuthenticationError",
    "BackwardResult",
    "CalibrateResult",
    "DefaultAttentionResult",
    "DefaultBackwardResult",
    "DefaultSampleResult",
    "EngineInfo",
    "GradientHealth",
    "HeadDiagnostics",
    "HeadGradientHealth",
    "OverloadedError",
    "PayloadTooLargeError",
    "ReliabilityBin",
    "RetryPolicy",
    "SampleDiagnostics",
    "SampleResult",
    "ScoreStats",
    "ServerTimeoutError",
    "ServiceError",
    "SoftmaxDiagnostics",
    "SoftmaxResult",
    "SweepRow",
    "TokenLogprob",
    "TransportError",
    "ValidationError",
    "__version__",
    "decode_tensor",
    "encode_tensor",
]
