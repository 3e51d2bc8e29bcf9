"""Typed results, one per endpoint; tensors are numpy arrays, ``raw`` keeps the whole JSON answer.

A call with the default ``returns`` gets the ``Default...Result`` subclass, whose fields for those
outputs are not Optional (``client.attention(q, k, v).output`` is an array to a type checker); a
call that names its ``returns`` gets the base class, where what was not asked for is None.
Diagnostics are ``TypedDict``s (plain dicts at run time, as the service sends them), defined in
:mod:`attention_client.diagnostics` and importable from here as well.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Self

from attention_client._parse import Array, missing, number, required_tensor, tensor, timing
from attention_client.diagnostics import (
    AttentionDiagnostics,
    GradientHealth,
    HeadDiagnostics,
    HeadGradientHealth,
    HeadInspection,
    InspectionReport,
    RowValues,
    SampleDiagnostics,
    ScoreStats,
    SessionDiagnostics,
    SoftmaxDiagnostics,
)
from attention_client.logits_results import (
    CalibrateResult,
    DefaultSampleResult,
    ReliabilityBin,
    SampleResult,
    SoftmaxResult,
    TokenLogprob,
)

__all__ = [
    "AnalyzeResult",
    "AttentionDiagnostics",
    "AttentionResult",
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
    "ReliabilityBin",
    "RolloutResult",
    "RowValues",
    "SampleDiagnostics",
    "SampleResult",
    "ScoreStats",
    "SessionDiagnostics",
    "SessionStepResult",
    "SoftmaxDiagnostics",
    "SoftmaxResult",
    "SweepRow",
    "TokenLogprob",
]


@dataclass(frozen=True, slots=True)
class EngineInfo:
    """Which engine ran the request (``numpy`` or ``onnx``), on which provider, and why ``auto`` chose it."""

    name: str
    provider: str
    reason: str

    @classmethod
    def parse(cls, body: dict[str, Any]) -> EngineInfo | None:
        engine = body.get("engine")
        if not isinstance(engine, dict):
            return None
        return cls(str(engine.get("name", "")), str(engine.get("provider", "")), str(engine.get("reason", "")))


@dataclass(frozen=True, slots=True)
class AttentionResult:
    """``POST /v1/attention``: each tensor is None unless it was asked for in ``returns``."""

    output: Array | None
    weights: Array | None
    scores: Array | None
    diagnostics: AttentionDiagnostics | None
    engine: EngineInfo | None
    timing_ms: dict[str, float]
    request_id: str | None
    raw: dict[str, Any] = field(repr=False)
    gradient_health: GradientHealth | None = None
    """With ``"gradient_health"`` in ``returns``: how much gradient the normalizer lets through, per head."""
    inspection: InspectionReport | None = None
    """With ``"inspection"`` in ``returns``: sink mass, spectral norm, pattern scores (with ``token_ids``) and the
    norm-based summary, one entry per (batch, query head) in ``inspection["heads"]``."""
    norm_weights: Array | None = None
    """With ``"norm_weights"`` in ``returns``: ``||A_ij v_j||`` (Kobayashi et al. 2020), the weights' shape."""

    @classmethod
    def parse(cls, body: dict[str, Any], request_id: str | None) -> Self:
        return cls(
            output=tensor(body, "output"),
            weights=tensor(body, "weights"),
            scores=tensor(body, "scores"),
            diagnostics=body.get("diagnostics"),
            engine=EngineInfo.parse(body),
            timing_ms=timing(body),
            request_id=request_id,
            raw=body,
            gradient_health=body.get("gradient_health"),
            inspection=body.get("inspection"),
            norm_weights=tensor(body, "norm_weights"),
        )


@dataclass(frozen=True, slots=True)
class DefaultAttentionResult(AttentionResult):
    """``POST /v1/attention`` with the default ``returns``: ``output``, ``weights`` and ``diagnostics``
    are always there (``scores`` is None), and so is ``engine``.
    """

    output: Array
    weights: Array
    diagnostics: AttentionDiagnostics
    engine: EngineInfo

    def __post_init__(self) -> None:
        missing(self, ("output", "weights", "diagnostics", "engine"))


@dataclass(frozen=True, slots=True)
class BackwardResult:
    """``POST /v1/attention/backward``: the gradients asked for in ``returns`` (others None)."""

    grad_query: Array | None
    grad_key: Array | None
    grad_value: Array | None
    grad_mask: Array | None
    grad_scale: float | None
    grad_temperature: float | None
    output: Array | None
    weights: Array | None
    gradient_health: GradientHealth | None
    engine: EngineInfo | None
    timing_ms: dict[str, float]
    request_id: str | None
    raw: dict[str, Any] = field(repr=False)
    head_importance: Array | None = None
    """With ``"head_importance"`` in ``returns``: ``(B, H)``, ``|sum(grad_output * output)|`` per batch entry and
    query head (Michel et al. 2019, per example; the mean over examples and any normalisation are the caller's)."""

    @classmethod
    def parse(cls, body: dict[str, Any], request_id: str | None) -> Self:
        return cls(
            grad_query=tensor(body, "grad_query"),
            grad_key=tensor(body, "grad_key"),
            grad_value=tensor(body, "grad_value"),
            grad_mask=tensor(body, "grad_mask"),
            grad_scale=number(body, "grad_scale"),
            grad_temperature=number(body, "grad_temperature"),
            output=tensor(body, "output"),
            weights=tensor(body, "weights"),
            gradient_health=body.get("gradient_health"),
            engine=EngineInfo.parse(body),
            timing_ms=timing(body),
            request_id=request_id,
            raw=body,
            head_importance=tensor(body, "head_importance"),
        )


@dataclass(frozen=True, slots=True)
class DefaultBackwardResult(BackwardResult):
    """``POST /v1/attention/backward`` with the default ``returns``: ``grad_query``, ``grad_key`` and
    ``grad_value`` are always there, and so is ``engine``.
    """

    grad_query: Array
    grad_key: Array
    grad_value: Array
    engine: EngineInfo

    def __post_init__(self) -> None:
        missing(self, ("grad_query", "grad_key", "grad_value", "engine"))


@dataclass(frozen=True, slots=True)
class SweepRow:
    """One (scale, temperature[, head_dim]) point of ``/v1/attention/analyze``."""

    scale: float
    temperature: float
    head_dim: int | None
    score_std: float | None
    score_range: float | None
    mean_entropy: float | None
    mean_normalized_entropy: float | None
    saturated_fraction: float | None
    mean_jacobian_norm: float | None
    vanishing_fraction: float | None
    raw: dict[str, Any] = field(repr=False)

    @classmethod
    def parse(cls, row: dict[str, Any]) -> SweepRow:
        head_dim = row.get("head_dim")
        return cls(
            scale=float(row["scale"]),
            temperature=float(row["temperature"]),
            head_dim=None if head_dim is None else int(head_dim),
            score_std=number(row, "score_std"),
            score_range=number(row, "score_range"),
            mean_entropy=number(row, "mean_entropy"),
            mean_normalized_entropy=number(row, "mean_normalized_entropy"),
            saturated_fraction=number(row, "saturated_fraction"),
            mean_jacobian_norm=number(row, "mean_jacobian_norm"),
            vanishing_fraction=number(row, "vanishing_fraction"),
            raw=row,
        )


@dataclass(frozen=True, slots=True)
class AnalyzeResult:
    """``POST /v1/attention/analyze``: ``sweep``, one row per (scale, temperature[, head_dim])."""

    sweep: list[SweepRow]
    timing_ms: dict[str, float]
    request_id: str | None
    raw: dict[str, Any] = field(repr=False)

    @classmethod
    def parse(cls, body: dict[str, Any], request_id: str | None) -> AnalyzeResult:
        rows = body.get("sweep") or []
        return cls(sweep=[SweepRow.parse(r) for r in rows], timing_ms=timing(body), request_id=request_id, raw=body)


@dataclass(frozen=True, slots=True)
class RolloutResult:
    """``POST /v1/attention/rollout``: ``rollout`` ``(B, L, L)``, or ``(B, R, L)`` for the ``rows`` asked for; with
    ``top_k``, ``top_keys`` and ``top_values`` ``(B, R, k)`` instead.

    Row ``i`` is how much output position ``i`` draws on each input token through every layer
    (``A_hat[last] @ ... @ A_hat[first]``); its dtype is the call's ``precision``.
    """

    rollout: Array | None
    """The whole rows (None with ``top_k``)."""
    timing_ms: dict[str, float]
    request_id: str | None
    raw: dict[str, Any] = field(repr=False)
    top_keys: Array | None = None
    """With ``top_k``: ``(B, R, k)`` int64, the key indices of each row's ``k`` largest entries, largest first."""
    top_values: Array | None = None
    """With ``top_k``: ``(B, R, k)``, those entries (``rollout[b, r, top_keys[b, r]]``)."""

    @classmethod
    def parse(cls, body: dict[str, Any], request_id: str | None) -> RolloutResult:
        top = "top_keys" in body  # a top_k answer: its two tensors required, the whole rows absent
        return cls(
            rollout=tensor(body, "rollout") if top else required_tensor(body, "rollout", request_id),
            timing_ms=timing(body),
            request_id=request_id,
            raw=body,
            top_keys=required_tensor(body, "top_keys", request_id) if top else None,
            top_values=required_tensor(body, "top_values", request_id) if top else None,
        )


@dataclass(frozen=True, slots=True)
class SessionStepResult:
    """``POST /v1/sessions/{sequence_id}/steps``: the step's arrays (those not asked for in ``returns`` are None)
    and the cache after it.
    """

    output: Array | None
    weights: Array | None
    """Over the kept positions: sent unasked while it has at most 65,536 values (ask for it by name beyond)."""
    diagnostics: SessionDiagnostics | None
    cache_length: int
    """Positions the cache keeps after this step (0 once the session ended)."""
    positions_seen: int
    """Positions appended since the start."""
    restarted: bool
    """This start replaced a live sequence of the same id (another client, or one that lost track of it)."""
    ended: bool
    """The session ended with this step (``end=True``): its cache is freed."""
    engine: EngineInfo | None
    timing_ms: dict[str, float]
    request_id: str | None
    raw: dict[str, Any] = field(repr=False)

    @classmethod
    def parse(cls, body: dict[str, Any], request_id: str | None) -> Self:
        return cls(
            output=tensor(body, "output"),
            weights=tensor(body, "weights"),
            diagnostics=body.get("diagnostics"),
            cache_length=int(body.get("cache_length", 0)),
            positions_seen=int(body.get("positions_seen", 0)),
            restarted=bool(body.get("restarted", False)),
            ended=bool(body.get("ended", False)),
            engine=EngineInfo.parse(body),
            timing_ms=timing(body),
            request_id=request_id,
            raw=body,
        )


@dataclass(frozen=True, slots=True)
class DefaultSessionStepResult(SessionStepResult):
    """A step with the default ``returns``: ``output`` and ``diagnostics`` are always there, and so is ``engine``
    (``weights`` while small).
    """

    output: Array
    diagnostics: SessionDiagnostics
    engine: EngineInfo

    def __post_init__(self) -> None:
        missing(self, ("output", "diagnostics", "engine"))
