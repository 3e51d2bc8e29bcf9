"""Typed results, one per endpoint; tensors are numpy arrays, ``raw`` keeps the whole JSON answer.

A call with the default ``returns`` gets the ``Default...Result`` subclass, whose fields for those
outputs are not Optional (``client.attention(q, k, v).output`` is an array to a type checker); a
call that names its ``returns`` gets the base class, where what was not asked for is None.
Diagnostics are ``TypedDict``s (plain dicts at run time, as the service sends them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NotRequired, Self, TypeAlias, TypedDict, cast

import numpy as np
import numpy.typing as npt

from attention_client._wire import decode_tensor
from attention_client.errors import ServiceError

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
    "ReliabilityBin",
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

Array = npt.NDArray[Any]

RowValues: TypeAlias = "float | list[RowValues]"
"""One number per row, as JSON: nested lists with the input's shape without its last axis (a bare number
when the input was one row). ``np.asarray(values)`` makes an array of it."""


class HeadDiagnostics(TypedDict):
    """Per (batch, query head) of ``/v1/attention``'s ``diagnostics``."""

    batch: int
    head: int
    mean_entropy: float
    mean_normalized_entropy: float
    mean_distance: float
    collapsed: bool
    uniform: bool
    live_rows: int
    informative_rows: int
    collapsed_fraction: float


class ScoreStats(TypedDict):
    """Statistics of the scores over unmasked positions."""

    min: float
    max: float
    mean: float
    std: float
    count: int


class AttentionDiagnostics(TypedDict):
    """``/v1/attention``'s ``diagnostics``: per-row values (the query's shape without its last axis),
    per-head summaries, and counts over the whole request.
    """

    entropy: RowValues
    normalized_entropy: RowValues
    max_weight: RowValues
    argmax: RowValues
    effective_support: RowValues
    zeros: RowValues
    attention_distance: RowValues
    heads: list[HeadDiagnostics]
    fully_masked_rows: int
    row_sum_max_error: float
    non_finite: int
    saturated_rows: int
    score_stats: ScoreStats | None


class SessionDiagnostics(AttentionDiagnostics):
    """A session step's ``diagnostics``: attention's, over each row of kept positions, and ``sink_mass``."""

    sink_mass: RowValues
    """Each row's weight on the sequence's positions 0 to ``sink_positions - 1`` (those the cache still keeps)."""


class SoftmaxDiagnostics(TypedDict):
    """``/v1/softmax``'s ``diagnostics``: per row (a number for a single row), and counts."""

    entropy: RowValues
    max: RowValues
    argmax: RowValues
    fully_masked_rows: NotRequired[int]
    non_finite: NotRequired[int]
    row_sum_max_error: NotRequired[float]


class SampleDiagnostics(TypedDict):
    """``/v1/sample``'s ``diagnostics``: per row of logits (a number for a single row)."""

    entropy_raw: RowValues
    """Entropy (nats) of softmax(logits) as given."""
    entropy: RowValues
    """Entropy (nats) of the final distribution."""
    kept: RowValues
    """Tokens with nonzero final probability."""
    removed_mass: RowValues
    """Probability mass the filters removed."""


class HeadGradientHealth(TypedDict):
    """Per (batch, query head), over its rows with at least two valid keys."""

    batch: int
    head: int
    mean_jacobian_norm: float
    vanishing_fraction: float
    rows: int


class GradientHealth(TypedDict):
    """How much gradient the normalizer lets through, per head (``gradient_health``)."""

    threshold: float
    heads: list[HeadGradientHealth]


def _missing(result: object, names: tuple[str, ...]) -> None:
    """Raise when an answer to a default-``returns`` call lacks one of its outputs (a server out of step)."""
    absent = [n for n in names if getattr(result, n) is None]
    if absent:
        raise ServiceError(
            200,
            {"title": "unexpected answer", "detail": f"the answer lacks {', '.join(absent)}"},
            request_id=getattr(result, "request_id", None),
        )


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
    diagnostics: AttentionDiagnostics | None
    engine: EngineInfo | None
    timing_ms: dict[str, float]
    request_id: str | None
    raw: dict[str, Any] = field(repr=False)
    gradient_health: GradientHealth | None = None
    """With ``"gradient_health"`` in ``returns``: how much gradient the normalizer lets through, per head."""

    @classmethod
    def parse(cls, body: dict[str, Any], request_id: str | None) -> Self:
        return cls(
            output=_tensor(body, "output"),
            weights=_tensor(body, "weights"),
            scores=_tensor(body, "scores"),
            diagnostics=body.get("diagnostics"),
            engine=EngineInfo.parse(body),
            timing_ms=_timing(body),
            request_id=request_id,
            raw=body,
            gradient_health=body.get("gradient_health"),
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
        _missing(self, ("output", "weights", "diagnostics", "engine"))


@dataclass(frozen=True, slots=True)
class SoftmaxResult:
    """``POST /v1/softmax``: ``probabilities``, ``log_probabilities`` (with ``log=True``) and per-row
    ``diagnostics`` (``entropy``, ``max``, ``argmax``).
    """

    probabilities: Array
    log_probabilities: Array | None
    diagnostics: SoftmaxDiagnostics
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
            diagnostics=cast(SoftmaxDiagnostics, body.get("diagnostics") or {"entropy": [], "max": [], "argmax": []}),
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
    gradient_health: GradientHealth | None
    engine: EngineInfo | None
    timing_ms: dict[str, float]
    request_id: str | None
    raw: dict[str, Any] = field(repr=False)

    @classmethod
    def parse(cls, body: dict[str, Any], request_id: str | None) -> Self:
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
class DefaultBackwardResult(BackwardResult):
    """``POST /v1/attention/backward`` with the default ``returns``: ``grad_query``, ``grad_key`` and
    ``grad_value`` are always there, and so is ``engine``.
    """

    grad_query: Array
    grad_key: Array
    grad_value: Array
    engine: EngineInfo

    def __post_init__(self) -> None:
        _missing(self, ("grad_query", "grad_key", "grad_value", "engine"))


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
            score_std=_float(row, "score_std"),
            score_range=_float(row, "score_range"),
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
    top_logprobs: list[TokenLogprob] | list[list[TokenLogprob]] | None
    """Per row (a list per row for ``(N, V)`` logits): the most probable tokens of the final distribution."""
    probabilities: Array | None
    diagnostics: SampleDiagnostics | None
    seed: int | None
    timing_ms: dict[str, float]
    request_id: str | None
    raw: dict[str, Any] = field(repr=False)

    @classmethod
    def parse(cls, body: dict[str, Any], request_id: str | None) -> Self:
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


@dataclass(frozen=True, slots=True)
class DefaultSampleResult(SampleResult):
    """``POST /v1/sample`` with the default ``returns``: ``tokens``, ``logprobs`` and ``diagnostics`` are
    always there.
    """

    tokens: Array
    logprobs: Array
    diagnostics: SampleDiagnostics

    def __post_init__(self) -> None:
        _missing(self, ("tokens", "logprobs", "diagnostics"))


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
            output=_tensor(body, "output"),
            weights=_tensor(body, "weights"),
            diagnostics=body.get("diagnostics"),
            cache_length=int(body.get("cache_length", 0)),
            positions_seen=int(body.get("positions_seen", 0)),
            restarted=bool(body.get("restarted", False)),
            ended=bool(body.get("ended", False)),
            engine=EngineInfo.parse(body),
            timing_ms=_timing(body),
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
        _missing(self, ("output", "diagnostics", "engine"))
