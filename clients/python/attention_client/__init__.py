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
        i = client.attention(q, k, v, returns=["inspection", "norm_weights"], token_ids=ids)
        i.inspection["heads"][0]["sink_mass"], i.norm_weights  # per-head inspection, ||A_ij v_j||
        client.rollout(stack, rows=[0]).rollout  # rollout across layers of a [layers, B, H, L, L] stack

``client.session()`` is an attention session (the server keeps a sequence's keys and values; each
step sends only its new positions)::

    with client.session("chat-1") as s:  # ended (its cache freed) when the block exits
        r = s.step(q, k, v)               # the first step starts the sequence, later ones append
        r.output, r.cache_length, r.positions_seen, r.diagnostics["sink_mass"]

``AsyncAttentionClient`` (and its ``AsyncAttentionSession``) is the same for ``asyncio``
(``client.py``, ``attention.py``, ``logits.py``, ``analysis.py`` and ``session.py`` are generated from
``async_client.py``, ``async_attention.py``, ``async_logits.py``, ``async_analysis.py`` and ``async_session.py``).
``help(AttentionClient.attention)`` documents every parameter.
"""

from __future__ import annotations

from attention_client._common import API_KEY_ENV, DEFAULT_URL
from attention_client._version import __version__
from attention_client._wire import decode_tensor, encode_tensor
from attention_client.async_client import AsyncAttentionClient
from attention_client.async_session import AsyncAttentionSession
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
    DefaultSessionStepResult,
    EngineInfo,
    GradientHealth,
    HeadDiagnostics,
    HeadGradientHealth,
    HeadInspection,
    InspectionReport,
    ReliabilityBin,
    RolloutResult,
    SampleDiagnostics,
    SampleResult,
    ScoreStats,
    SessionDiagnostics,
    SessionStepResult,
    SoftmaxDiagnostics,
    SoftmaxResult,
    SweepRow,
    TokenLogprob,
)
from attention_client.retry import RetryPolicy
from attention_client.session import AttentionSession

__all__ = [
    "API_KEY_ENV",
    "DEFAULT_URL",
    "AnalyzeResult",
    "AsyncAttentionClient",
    "AsyncAttentionSession",
    "AttentionClient",
    "AttentionDiagnostics",
    "AttentionResult",
    "AttentionSession",
    "AuthenticationError",
    "BackwardResult",
    "CalibrateResult",
    "DefaultAttentionResult",
    "DefaultBackwardResult",
    "DefaultSampleResult",
    "DefaultSessionStepResult",
    "EngineInfo",
    "GradientHealth",
    "HeadDiagnostics",
    "HeadGradientHealth",
    "HeadInspection",
    "InspectionReport",
    "OverloadedError",
    "PayloadTooLargeError",
    "ReliabilityBin",
    "RetryPolicy",
    "RolloutResult",
    "SampleDiagnostics",
    "SampleResult",
    "ScoreStats",
    "ServerTimeoutError",
    "ServiceError",
    "SessionDiagnostics",
    "SessionStepResult",
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
