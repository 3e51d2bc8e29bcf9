"""The results of the logits endpoints: ``/v1/softmax``, ``/v1/sample`` and ``/v1/calibrate`` (importable from
:mod:`attention_client.results` and :mod:`attention_client` as well).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Self, cast

import numpy as np

from attention_client._parse import Array, missing, number, tensor, timing
from attention_client.diagnostics import SampleDiagnostics, SoftmaxDiagnostics

__all__ = [
    "CalibrateResult",
    "DefaultSampleResult",
    "ReliabilityBin",
    "SampleResult",
    "SoftmaxResult",
    "TokenLogprob",
]


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
        probabilities = tensor(body, "probabilities")
        assert probabilities is not None, "a softmax answer always has probabilities"
        return cls(
            probabilities=probabilities,
            log_probabilities=tensor(body, "log_probabilities"),
            diagnostics=cast(SoftmaxDiagnostics, body.get("diagnostics") or {"entropy": [], "max": [], "argmax": []}),
            timing_ms=timing(body),
            request_id=request_id,
            raw=body,
        )


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
            tokens=tensor(body, "tokens", np.int64),
            logprobs=tensor(body, "logprobs"),
            raw_logprobs=tensor(body, "raw_logprobs"),
            top_logprobs=_top_logprobs(body.get("top_logprobs")),
            probabilities=tensor(body, "probabilities"),
            diagnostics=body.get("diagnostics"),
            seed=None if seed is None else int(seed),
            timing_ms=timing(body),
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
        missing(self, ("tokens", "logprobs", "diagnostics"))


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
                    confidence=number(b, "confidence"),
                    accuracy=number(b, "accuracy"),
                )
                for b in bins
            ]
            for when, bins in (body.get("reliability") or {}).items()
        }
        return cls(
            temperature=float(body["temperature"]),
            nll={str(k): float(v) for k, v in (body.get("nll") or {}).items()},
            ece={str(k): float(v) for k, v in (body.get("ece") or {}).items()},
            accuracy=number(body, "accuracy"),
            reliability=reliability,
            bounded=bool(body.get("bounded", False)),
            timing_ms=timing(body),
            request_id=request_id,
            raw=body,
        )
