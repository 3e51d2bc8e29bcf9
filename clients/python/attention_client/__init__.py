"""Python client for the attention service (sync and async): numpy in, numpy out.

Tensors travel in the ``b64`` wire form both ways (little-endian C order), answers are
not compressed unless asked (``compression=True``), 503/429 and connection failures are
retried with backoff honouring ``Retry-After`` (:class:`RetryPolicy`), and every failure
is a :class:`ServiceError` carrying the problem+json fields::

    import numpy as np
    from attention_client import AttentionClient

    with AttentionClient("http://127.0.0.1:8000") as client:
        r = client.attention(q, k, v, causal="top_left", normalizer="entmax15")
        r.output, r.weights, r.diagnostics["entropy"], r.engine.name, r.request_id
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
    AttentionResult,
    BackwardResult,
    CalibrateResult,
    EngineInfo,
    ReliabilityBin,
    SampleResult,
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
    "AttentionResult",
    "AuthenticationError",
    "BackwardResult",
    "CalibrateResult",
    "EngineInfo",
    "OverloadedError",
    "PayloadTooLargeError",
    "ReliabilityBin",
    "RetryPolicy",
    "SampleResult",
    "ServerTimeoutError",
    "ServiceError",
    "SoftmaxResult",
    "SweepRow",
    "TokenLogprob",
    "TransportError",
    "ValidationError",
    "__version__",
    "decode_tensor",
    "encode_tensor",
]
