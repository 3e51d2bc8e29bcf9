"""The Python client, kept importable as ``service.client``.

The client is its own distribution, ``attention-client`` (``clients/python/``, import
``attention_client``; it needs only httpx and numpy), and the only one that ships the
package. The server's ``client`` extra depends on it; it is not on PyPI, so install it
from the repository first (``pip install ./clients/python``; ``make`` does). With it
installed, ``from service.client import AttentionClient`` keeps working.
"""

from __future__ import annotations

try:
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
except ImportError as exc:  # the attention-client distribution (or its httpx) is not installed
    raise ImportError(
        f"service.client needs the attention-client distribution ({exc.name} is missing): "
        "pip install ./clients/python (the server's 'client' extra)",
        name=exc.name,
    ) from exc

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
