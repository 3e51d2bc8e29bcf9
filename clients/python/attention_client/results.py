"""Typed results, one per endpoint; tensors are numpy arrays, ``raw`` keeps the whole JSON answer."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from attention_client._wire import decode_tensor

__all__ = [
    "AnalyzeResult",
    "AttentionResult",
    "BackwardResult",
    "CalibrateResult",
    "EngineInfo",
    "ReliabilityBin",
    "SampleResult",
    "SoftmaxResult",
    "SweepRow",
    "TokenLogprob",
]

Array = npt.NDArray[Any]


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


def _tensor(body: dict[str, Any], name: str, dtype: npt.DTypeLike = np.float64) -> Array | None:
    return decode_tensor(body[name], dtype) if body.get(name) is not None else None


def _timing(body: dict[str, Any]) -> dict[str, float]:
    timing = body.get("timing_ms")
    return {str(k): float(v) for k, v in timing.items()} if isinstance(timing, dict) else {}


def _float(body: dict[str, Any], name: str) -> float | None:
    value = body.get(name)
    return None if value is None else float(value)


@dataclass(frozen=True, slots=True)
class AttentionResult:
    """``POST /v1/attention``: each tensor is None unless it was asked for in ``returns``."""

    output: Array | None
    weights: Array | None
    scores: Array | None
    diagnostics: dict[str, Any] | None
    engine: EngineInfo | None
    timing_ms: dict[str, float]
    request_id: str | None
    raw: dict[str, Any] = field(repr=False)

    @classmethod
    def parse(cls, body: dict[str, Any], request_id: str | None) -> AttentionResult:
        return cls(
            output=_tensor(body, "output"),
            weights=_tensor(body, "weights"),
            scores=_tensor(body, "scores"),
            diagnostics=body.get("diagnostics"),
            engine=EngineInfo.parse(body),
            timing_ms=_timing(body),
            request_id=request_id,
            raw=body,
        )


@dataclass(frozen=True, slots=True)
class SoftmaxResult:
    """``POST /v1/softmax``: ``probabilities``, ``log_probabilities`` (with ``log=True``) and per-row
    ``diagnostics`` (``entropy``, ``max``, ``argmax``).
    """

    probabilities: Array
    log_probabilities: Array | None
    diagnostics: dict[str, Any]
    timing_ms: dict[str, float]
    request_id: str | None
    raw: dict[str, Any] = field(repr=False)

    @classmethod
    def parse(cls, body: dict[str, Any], request_id: str | None) -> SoftmaxResult:
        probabilities = _tensor(body, "probabilities")
        assert probabilities is not None, "a softmax answer always has probabilities"
        return cls(
            probabilities=probabilities,
            log_probabilities=_tensor(body, "log_probabilities"),
            diagnostics=dict(body.get("diagnostics") or {}),
            timing_ms=_timing(body),
            request_id=request_id,
            raw=body,
        )


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
    gradient_health: Any
    engine: EngineInfo | None
    timing_ms: dict[str, float]
    request_id: str | None
    raw: dict[str, Any] = field(repr=False)

    @classmethod
    def parse(cls, body: dict[str, Any], request_id: str | None) -> BackwardResult:
        return cls(
            grad_query=_tensor(body, "grad_query"),
            grad_key=_tensor(body, "grad_key"),
            grad_value=_tensor(body, "grad_value"),
            grad_mask=_tensor(body, "grad_mask"),
            grad_scale=_float(body, "grad_scale"),
            grad_temperature=_float(body, "grad_temperature"),
            output=_tensor(body, "output"),
            weights=_tensor(body, "weights"),
            gradient_health=body.get("gradient_health"),
            engine=EngineInfo.parse(body),
            timing_ms=_timing(body),
            request_id=request_id,
            raw=body,
        )


@dataclass(frozen=True, slots=True)
class SweepRow:
    """One (scale, temperature[, head_dim]) point of ``/v1/attention/analyze``."""

    scale: float
    temperature: float
    head_dim: int | None
    score_std: float | None
    score_range: Any
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
            score_std=_float(row, "score_std"),
            score_range=row.get("score_range"),
            mean_entropy=_float(row, "mean_entropy"),
            mean_normalized_entropy=_float(row, "mean_normalized_entropy"),
            saturated_fraction=_float(row, "saturated_fraction"),
            mean_jacobian_norm=_float(row, "mean_jacobian_norm"),
            vanishing_fraction=_float(row, "vanishing_fraction"),
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
        return cls(sweep=[SweepRow.parse(r) for r in rows], timing_ms=_timing(body), request_id=request_id, raw=body)


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One of the most probable tokens of the final distribution."""

    token: int
    logprob: float


@dataclass(frozen=True, slots=True)
class SampleResult:
    """``POST /v1/sample``: ``tokens`` (``(n,)`` or ``(N, n)``), their ``logprobs``, and what was asked."""

    tokens: Array | None
    logprobs: Array | None
    raw_logprobs: Array | None
    top_logprobs: Any
    probabilities: Array | None
    diagnostics: Any
    seed: int | None
    timing_ms: dict[str, float]
    request_id: str | None
    raw: dict[str, Any] = field(repr=False)

    @classmethod
    def parse(cls, body: dict[str, Any], request_id: str | None) -> SampleResult:
        seed = body.get("seed")
        return cls(
            tokens=_tensor(body, "tokens", np.int64),
            logprobs=_tensor(body, "logprobs"),
            raw_logprobs=_tensor(body, "raw_logprobs"),
            top_logprobs=_top_logprobs(body.get("top_logprobs")),
            probabilities=_tensor(body, "probabilities"),
            diagnostics=body.get("diagnostics"),
            seed=None if seed is None else int(seed),
            timing_ms=_timing(body),
            request_id=request_id,
            raw=body,
        )


def _top_logprobs(value: Any) -> Any:
    """``[{"token", "logprob"}, ...]`` entries as :class:`TokenLogprob`, at any nesting (per row, per sample)."""
    if isinstance(value, dict) and "token" in value and "logprob" in value:
        return TokenLogprob(int(value["token"]), float(value["logprob"]))
    if isinstance(value, list):
        return [_top_logprobs(v) for v in value]
    return value


@dataclass(frozen=True, slots=True)
class ReliabilityBin:
    """One equal-width confidence bin ``(lower, upper]`` of a reliability diagram."""

    lower: float
    upper: float
    count: int
    confidence: float | None
    accuracy: float | None


@dataclass(frozen=True, slots=True)
class CalibrateResult:
    """``POST /v1/calibrate``: the fitted temperature, NLL and ECE before and after, reliability bins."""

    temperature: float
    nll: dict[str, float]
    ece: dict[str, float]
    accuracy: float | None
    reliability: dict[str, list[ReliabilityBin]]
    bounded: bool
    timing_ms: dict[str, float]
    request_id: str | None
    raw: dict[str, Any] = field(repr=False)

    @classmethod
    def parse(cls, body: dict[str, Any], request_id: str | None) -> CalibrateResult:
        reliability = {
            str(when): [
                ReliabilityBin(
                    lower=float(b["lower"]),
                    upper=float(b["upper"]),
                    count=int(b["count"]),
                    confidence=_float(b, "confidence"),
                    accuracy=_float(b, "accuracy"),
                )
                for b in bins
            ]
            for when, bins in (body.get("reliability") or {}).items()
        }
        return cls(
            temperature=float(body["temperature"]),
            nll={str(k): float(v) for k, v in (body.get("nll") or {}).items()},
            ece={str(k): float(v) for k, v in (body.get("ece") or {}).items()},
            accuracy=_float(body, "accuracy"),
            reliability=reliability,
            bounded=bool(body.get("bounded", False)),
            timing_ms=_timing(body),
            request_id=request_id,
            raw=body,
        )
