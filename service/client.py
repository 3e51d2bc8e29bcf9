"""The Python client, kept importable as ``service.client``.

The client is its own distribution, ``attention-client`` (``clients/python/``, import
``attention_client``; it needs only httpx and numpy). The server's install maps that
package too, so ``from service.client import AttentionClient`` keeps working.
"""

from __future__ import annotations

from attention_client import (
    API_KEY_ENV,
    DEFAULT_URL,
    AnalyzeResult,
    AsyncAttentionClient,
    AttentionClient,
    AttentionResult,
    AuthenticationError,
    BackwardResult,
    CalibrateResult,
    EngineInfo,
    OverloadedError,
    PayloadTooLargeError,
    ReliabilityBin,
    RetryPolicy,
    SampleResult,
    ServerTimeoutError,
    ServiceError,
    SoftmaxResult,
    SweepRow,
    TokenLogprob,
    TransportError,
    ValidationError,
    __version__,
    decode_tensor,
    encode_tensor,
)

AttentionReply = AttentionResult
"""The former name of :class:`attention_client.AttentionResult`."""

__all__ = [
    "API_KEY_ENV",
    "DEFAULT_URL",
    "AnalyzeResult",
    "AsyncAttentionClient",
    "AttentionClient",
    "AttentionReply",
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
