"""Request building and answer parsing of every /v1 method, against answers shaped as the fixed names say.

The live tests (test_live.py) run the methods whose routes are on main against a real server; these
check the exact bodies the client sends (docs/concepts/fixed-names.md's names) and the typed results it
builds.
"""

from __future__ import annotations

import base64
from typing import Any

import httpx
import numpy as np
from attention_client import (
    AnalyzeResult,
    AttentionClient,
    BackwardResult,
    CalibrateResult,
    DefaultSampleResult,
    SampleResult,
    TokenLogprob,
    encode_tensor,
)
from attention_client._wire import loads


def _b64(a: np.ndarray) -> dict[str, Any]:
    return {
        "shape": list(a.shape),
        "dtype": str(a.dtype),
        "b64": base64.b64encode(a.astype(a.dtype.newbyteorder("<")).tobytes()).decode(),
    }


def _replay(path: str, answer: dict[str, Any]) -> tuple[AttentionClient, list[dict[str, Any]]]:
    bodies: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == path and request.method == "POST"
        bodies.append(loads(request.content))
        return httpx.Response(200, json=answer, headers={"x-request-id": "rec-1"})

    return AttentionClient("http://test", transport=httpx.MockTransport(handler)), bodies


def test_attention_backward() -> None:
    gq = np.arange(8, dtype=np.float64).reshape(2, 4)
    answer = {
        "grad_query": _b64(gq),
        "grad_key": _b64(gq * 2),
        "grad_value": _b64(gq * 3),
        "grad_scale": -0.25,
        "grad_temperature": 0.125,
        "gradient_health": {"jacobian_norm": [0.4, 0.3]},
        "engine": {"name": "numpy", "provider": "CPU/numpy", "reason": "asked"},
        "timing_ms": {"total": 1.5},
    }
    c, bodies = _replay("/v1/attention/backward", answer)
    q = np.ones((2, 4))
    r = c.attention_backward(
        q,
        q,
        q,
        q,
        grad_weights=np.zeros((2, 2)),
        causal=True,
        normalizer="sparsemax",
        returns=["grad_query", "grad_key", "grad_value", "grad_scale", "grad_temperature", "gradient_health"],
    )
    body = bodies[0]
    assert {"query", "key", "value", "grad_output", "grad_weights"} <= body.keys()
    assert body["grad_output"] == encode_tensor(q) and body["causal"] is True and body["normalizer"] == "sparsemax"
    assert body["return"][:3] == ["grad_query", "grad_key", "grad_value"] and body["encoding"] == "base64"
    assert isinstance(r, BackwardResult) and r.request_id == "rec-1"
    assert r.grad_query is not None and np.array_equal(r.grad_query, gq)
    assert r.grad_value is not None and np.array_equal(r.grad_value, gq * 3)
    assert r.grad_mask is None and r.output is None
    assert r.grad_scale == -0.25 and r.grad_temperature == 0.125 and r.gradient_health == {"jacobian_norm": [0.4, 0.3]}
    assert r.engine is not None and r.engine.reason == "asked" and r.timing_ms == {"total": 1.5}


def test_analyze_with_drawn_inputs() -> None:
    row = {
        "scale": 0.125,
        "temperature": 1.0,
        "head_dim": 64,
        "score_std": 1.01,
        "score_range": 7.5,
        "mean_entropy": 3.9,
        "mean_normalized_entropy": 0.93,
        "saturated_fraction": 0.0,
        "mean_jacobian_norm": 0.12,
        "vanishing_fraction": 0.0,
    }
    c, bodies = _replay("/v1/attention/analyze", {"sweep": [row, {**row, "scale": 1.0}], "timing_ms": {"total": 3.0}})
    r = c.analyze(shape=[1, 2, 64, 64], distribution="normal", seed=3, temperatures=[0.5, 1, 2], head_dims=[16, 64])
    assert bodies[0] == {
        "shape": [1, 2, 64, 64],
        "distribution": "normal",
        "seed": 3,
        "temperatures": [0.5, 1.0, 2.0],
        "head_dims": [16, 64],
    }
    assert isinstance(r, AnalyzeResult) and [s.scale for s in r.sweep] == [0.125, 1.0]
    first = r.sweep[0]
    assert first.head_dim == 64 and first.mean_jacobian_norm == 0.12 and first.vanishing_fraction == 0.0
    assert first.score_range == 7.5 and first.raw == row


def test_analyze_with_given_tensors_sends_them() -> None:
    c, bodies = _replay("/v1/attention/analyze", {"sweep": []})
    q = np.ones((4, 8), np.float32)
    c.analyze(q, q, scales=[1.0], causal="bottom_right", normalizer="entmax15")
    assert bodies[0]["query"] == encode_tensor(q) and bodies[0]["causal"] == "bottom_right"
    assert "shape" not in bodies[0] and "encoding" not in bodies[0]


def test_sample() -> None:
    answer = {
        "tokens": [3, 0, 3],
        "logprobs": [-0.3412, -1.2410, -0.3412],
        "top_logprobs": [[{"token": 3, "logprob": -0.3412}, {"token": 0, "logprob": -1.2410}]],
        "probabilities": _b64(np.array([0.2891, 0, 0, 0.7109])),
        "diagnostics": {"entropy_raw": [0.8296], "entropy": [0.5996], "kept": [2], "removed_mass": [0.0646]},
        "seed": 1234,
        "timing_ms": {"total": 0.2},
    }
    c, bodies = _replay("/v1/sample", answer)
    r = c.sample(
        [2.1, 0.5, -1.2, 3.0],
        top_k=2,
        n=3,
        seed=1234,
        top_logprobs=2,
        previous_tokens=[0, 2, 2],
        returns=["tokens", "logprobs", "top_logprobs", "probabilities", "diagnostics"],
    )
    body = bodies[0]
    assert body["top_k"] == 2 and body["n"] == 3 and body["seed"] == 1234 and body["previous_tokens"] == [0, 2, 2]
    assert body["temperature"] == 1.0 and body["top_p"] == 1.0 and body["min_p"] == 0.0 and body["encoding"] == "base64"
    assert isinstance(r, SampleResult) and r.tokens is not None and r.tokens.dtype == np.int64
    assert r.tokens.tolist() == [3, 0, 3] and r.seed == 1234
    assert r.top_logprobs == [[TokenLogprob(3, -0.3412), TokenLogprob(0, -1.2410)]]
    assert r.probabilities is not None and r.probabilities.tolist() == [0.2891, 0, 0, 0.7109]
    assert r.diagnostics is not None and r.diagnostics["kept"] == [2] and r.raw_logprobs is None


def test_sample_previous_tokens_per_row() -> None:
    diagnostics = {"entropy_raw": [1.38, 1.38], "entropy": [1.2, 1.1], "kept": [4, 3], "removed_mass": [0.0, 0.1]}
    answer = {"tokens": [[1], [0]], "logprobs": [[-1.2], [-0.9]], "diagnostics": diagnostics, "seed": 5}
    c, bodies = _replay("/v1/sample", answer)
    r = c.sample(np.zeros((2, 4)), previous_tokens=[[1, 1], [np.int64(2)]])
    assert bodies[0]["previous_tokens"] == [[1, 1], [2]] and "return" not in bodies[0]
    assert isinstance(r, DefaultSampleResult) and r.tokens.shape == (2, 1) and r.logprobs.shape == (2, 1)
    assert r.diagnostics["kept"] == [4, 3]


def test_calibrate() -> None:
    bins = [
        {"lower": 0.0, "upper": 0.5, "count": 0, "confidence": 0.0, "accuracy": 0.0},
        {"lower": 0.5, "upper": 1.0, "count": 4, "confidence": 0.9, "accuracy": 0.75},
    ]
    answer = {
        "temperature": 1.7,
        "nll": {"before": 0.9, "after": 0.7},
        "ece": {"before": 0.15, "after": 0.04},
        "accuracy": 0.75,
        "reliability": {"before": bins, "after": bins},
        "bounded": False,
        "timing_ms": {"total": 2.0},
    }
    c, bodies = _replay("/v1/calibrate", answer)
    r = c.calibrate(np.eye(4, 3) * 3, np.array([0, 1, 2, 0]), bins=2)
    assert bodies[0]["labels"] == [0, 1, 2, 0] and bodies[0]["bins"] == 2 and bodies[0]["method"] == "temperature"
    assert bodies[0]["logits"]["shape"] == [4, 3] and "encoding" not in bodies[0]
    assert isinstance(r, CalibrateResult) and r.temperature == 1.7 and r.bounded is False
    assert r.nll == {"before": 0.9, "after": 0.7} and r.ece["after"] == 0.04 and r.accuracy == 0.75
    assert [b.count for b in r.reliability["after"]] == [0, 4] and r.reliability["before"][1].accuracy == 0.75
