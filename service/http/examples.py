"""Examples of every request and answer in the OpenAPI schema, by operation id.

Answers are what the service really says to the request beside them (numpy engine,
float32 unless the request asks for float64); tests/http/test_docs.py sends each request
example to a fresh app and checks the answer's numbers against the documented one.
"""

from __future__ import annotations

from typing import Any

ATTENTION_REQUEST: dict[str, Any] = {
    "query": [[1.0, 0.0], [0.0, 1.0]],
    "key": [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]],
    "value": [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]],
    "causal": "bottom_right",
    "return": ["output", "weights"],
}
ATTENTION_RESPONSE: dict[str, Any] = {
    "output": [[1.6604769, 2.660477], [3.4066725, 4.4066725]],
    "weights": [[0.66976154, 0.33023846, 0.0], [0.19777583, 0.40111208, 0.40111208]],
    "engine": {"name": "numpy", "provider": "CPU/numpy", "reason": "auto: numpy supports this request"},
    "timing_ms": {"decode": 0.05, "compute": 0.2, "encode": 0.003, "diagnostics": 0.0, "total": 0.253},
}

SOFTMAX_REQUEST: dict[str, Any] = {"logits": [[2.1, 0.5, -1.2, 3.0]], "log": True, "precision": "float64"}
SOFTMAX_RESPONSE: dict[str, Any] = {
    "probabilities": [[0.2703884521991804, 0.054590487004978844, 0.009972782545824548, 0.6650482782500162]],
    "log_probabilities": [[-1.3078956420892487, -2.9078956420892488, -4.6078956420892485, -0.40789564208924867]],
    "diagnostics": {
        "entropy": [0.8296071532734213],
        "max": [0.6650482782500162],
        "argmax": [3],
        "fully_masked_rows": 0,
        "non_finite": 0,
        "row_sum_max_error": 0.0,
    },
    "timing_ms": {"decode": 0.07, "compute": 0.15, "diagnostics": 0.14, "total": 0.36},
}

BACKWARD_REQUEST: dict[str, Any] = {
    **{k: ATTENTION_REQUEST[k] for k in ("query", "key", "value", "causal")},
    "grad_output": [[1.0, 0.0], [0.0, 1.0]],
    "precision": "float64",
    "return": ["grad_query", "grad_key", "grad_value", "grad_scale"],
}
BACKWARD_RESPONSE: dict[str, Any] = {
    "grad_query": [[-0.3127971930902208, 0.3127971930902208], [0.11534416324677871, 0.33656983500604887]],
    "grad_key": [
        [-0.3127971930902208, -0.3365698350060492],
        [0.3127971930902208, -0.11534416324677907],
        [0.0, 0.4519139982528279],
    ],
    "grad_value": [
        [0.6697615493266569, 0.1977758146404282],
        [0.3302384506733431, 0.4011120926797859],
        [0.0, 0.4011120926797859],
    ],
    "grad_scale": 0.03361959261080317,
    "engine": {"name": "numpy", "provider": "CPU/numpy", "reason": "auto: numpy supports this request"},
    "timing_ms": {"decode": 0.2, "compute": 0.5, "encode": 0.008, "total": 0.708},
}

ANALYZE_REQUEST: dict[str, Any] = {"shape": [1, 2, 16, 64], "seed": 0, "scales": [0.125, 1.0], "temperatures": [1.0]}
ANALYZE_RESPONSE: dict[str, Any] = {
    "sweep": [
        {
            "scale": 0.125,
            "temperature": 1.0,
            "head_dim": 64,
            "score_std": 1.0049725879659888,
            "score_range": 3.5341468347673297,
            "mean_entropy": 2.36620655631231,
            "mean_normalized_entropy": 0.8534286161276805,
            "saturated_fraction": 0.0,
            "mean_jacobian_norm": 0.30748489616701835,
            "vanishing_fraction": 0.0,
            "rows": 32,
        },
        {
            "scale": 1.0,
            "temperature": 1.0,
            "head_dim": 64,
            "score_std": 8.03978070372791,
            "score_range": 28.273174678138638,
            "mean_entropy": 0.4006858830186566,
            "mean_normalized_entropy": 0.1445168840963078,
            "saturated_fraction": 0.0,
            "mean_jacobian_norm": 0.1858434893204723,
            "vanishing_fraction": 0.09375,
            "rows": 32,
        },
    ],
    "normalizer": "softmax",
    "shape": [1, 2, 16, 16],
    "kv_heads": 2,
    "seed": 0,
    "vanishing_threshold": 0.001,
    "saturation_margin": 1e-6,
    "timing_ms": {"decode": 12.7, "compute": 24.1, "total": 36.8},
}

ROLLOUT_REQUEST: dict[str, Any] = {
    "weights": [
        [[[[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.2, 0.3, 0.5]], [[1.0, 0.0, 0.0], [0.9, 0.1, 0.0], [0.6, 0.2, 0.2]]]],
        [[[[1.0, 0.0, 0.0], [0.3, 0.7, 0.0], [0.1, 0.1, 0.8]], [[1.0, 0.0, 0.0], [0.7, 0.3, 0.0], [0.4, 0.4, 0.2]]]],
    ],
    "precision": "float64",
}
"""Two layers of two causal heads over three tokens ([2, 1, 2, 3, 3]): fused by their mean, each A_hat is
0.5 * I + 0.5 * A_fused, and the answer is A_hat[1] @ A_hat[0]."""
ROLLOUT_RESPONSE: dict[str, Any] = {
    "rollout": [
        [[1.0, 0.0, 0.0], [0.5125, 0.48750000000000004, 0.0], [0.31875000000000003, 0.175, 0.5062500000000001]]
    ],
    "timing_ms": {"decode": 0.4, "compute": 0.5, "encode": 0.02, "total": 0.92},
}

SAMPLE_REQUEST: dict[str, Any] = {
    "logits": [2.1, 0.5, -1.2, 3.0],
    "top_k": 2,
    "seed": 7,
    "n": 3,
    "return": ["tokens", "logprobs", "probabilities", "diagnostics"],
}
SAMPLE_RESPONSE: dict[str, Any] = {
    "tokens": [3, 3, 3],
    "logprobs": [-0.34115386, -0.34115386, -0.34115386],
    "probabilities": [0.2890505, 0.0, 0.0, 0.71094954],
    "diagnostics": {
        "entropy_raw": 0.8296071705830945,
        "entropy": 0.6012993385230132,
        "kept": 2,
        "removed_mass": 0.064563276537197,
    },
    "seed": 7,
    "timing_ms": {"decode": 0.19, "compute": 6.9, "encode": 0.07, "total": 7.16},
}
CALIBRATE_REQUEST: dict[str, Any] = {
    "logits": [[3.0, 0.0, 0.0], [0.0, 3.0, 0.0], [2.5, 0.0, 0.5], [0.0, 0.5, 3.0], [3.0, 0.0, 0.0], [0.0, 0.0, 3.0]],
    "labels": [0, 1, 2, 2, 1, 2],
    "bins": 5,
}
CALIBRATE_RESPONSE: dict[str, Any] = {
    "temperature": 1.8232326954605018,
    "nll": {"before": 0.9500498134954712, "after": 0.8132089751390755},
    "ece": {"before": 0.22377884792388145, "after": 0.03455876128168637},
    "accuracy": 0.6666666666666666,
    "reliability": {
        "before": [
            {"lower": 0.0, "upper": 0.2, "count": 0, "confidence": None, "accuracy": None},
            {"lower": 0.2, "upper": 0.4, "count": 0, "confidence": None, "accuracy": None},
            {"lower": 0.4, "upper": 0.6000000000000001, "count": 0, "confidence": None, "accuracy": None},
            {"lower": 0.6000000000000001, "upper": 0.8, "count": 0, "confidence": None, "accuracy": None},
            {"lower": 0.8, "upper": 1.0, "count": 6, "confidence": 0.8904455145905481, "accuracy": 0.6666666666666666},
        ],
        "after": [
            {"lower": 0.0, "upper": 0.2, "count": 0, "confidence": None, "accuracy": None},
            {"lower": 0.2, "upper": 0.4, "count": 0, "confidence": None, "accuracy": None},
            {"lower": 0.4, "upper": 0.6000000000000001, "count": 0, "confidence": None, "accuracy": None},
            {
                "lower": 0.6000000000000001,
                "upper": 0.8,
                "count": 6,
                "confidence": 0.7012254279483531,
                "accuracy": 0.6666666666666666,
            },
            {"lower": 0.8, "upper": 1.0, "count": 0, "confidence": None, "accuracy": None},
        ],
    },
    "bounded": False,
    "timing_ms": {"decode": 0.08, "compute": 0.57, "total": 0.65},
}

SESSION_ID = 7
"""The sequence of the session examples (``/v1/sessions/7/steps``, ``DELETE /v1/sessions/7``)."""
SESSION_STEP_REQUEST: dict[str, Any] = {
    "start": True,
    "query": [[1.0, 0.0], [0.0, 1.0]],
    "key": [[1.0, 0.0], [0.0, 1.0]],
    "value": [[1.0, 2.0], [3.0, 4.0]],
    "return": ["output", "weights"],
}
"""The first step of sequence 7: two positions appended, two query rows (aligned bottom_right: the first row sees
position 0 only)."""
SESSION_STEP_RESPONSE: dict[str, Any] = {
    "output": [[1.0, 2.0], [2.339523, 3.339523]],
    "weights": [[1.0, 0.0], [0.33023846, 0.66976154]],
    "cache_length": 2,
    "positions_seen": 2,
    "restarted": False,
    "ended": False,
    "engine": {"name": "numpy", "provider": "CPU/numpy", "reason": "auto: numpy supports this request"},
    "timing_ms": {"decode": 0.27, "compute": 0.5, "encode": 0.08, "diagnostics": 0.002, "total": 0.852},
}
SESSION_END_RESPONSE: dict[str, Any] = {"sequence_id": SESSION_ID, "positions_seen": 2}
"""``DELETE /v1/sessions/7`` after the step above."""

V2_SOFTMAX_REQUEST: dict[str, Any] = {
    "id": "req-1",
    "inputs": [{"name": "logits", "shape": [1, 4], "datatype": "FP64", "data": [2.1, 0.5, -1.2, 3.0]}],
    "parameters": {"diagnostics": False},
}
V2_SOFTMAX_RESPONSE: dict[str, Any] = {
    "model_name": "softmax",
    "model_version": "1",
    "id": "req-1",
    "parameters": {"timing_ms": '{"decode":0.04,"compute":0.08,"diagnostics":0.0,"total":0.12}'},
    "outputs": [
        {
            "name": "probabilities",
            "datatype": "FP64",
            "shape": [1, 4],
            "data": [0.2703884521991804, 0.054590487004978844, 0.009972782545824548, 0.6650482782500162],
        }
    ],
}

ENGINES_RESPONSE: dict[str, Any] = {
    "engines": [
        {
            "name": "numpy",
            "provider": "CPU/numpy",
            "ready": True,
            "numpy_version": "2.4.6",
            "threads": 2,
            "supports": "every normalizer, mask, causal alignment, float32 and float64",
        }
    ]
}
MODEL_METADATA: dict[str, Any] = {
    "name": "softmax",
    "versions": ["1"],
    "platform": "attention_service",
    "description": "Softmax, sparsemax, entmax or ReLU normalization of logits along an axis.",
    "inputs": [{"name": "logits", "datatype": "FP32", "shape": [-1, -1]}],
    "outputs": [{"name": "probabilities", "datatype": "FP32", "shape": [-1, -1]}],
    "parameters": {"normalizer": "string: softmax (default), sparsemax, entmax15, entmax (needs alpha), relu"},
}

REQUEST_EXAMPLES: dict[str, Any] = {
    "attention": ATTENTION_REQUEST,
    "softmax": SOFTMAX_REQUEST,
    "attention_backward": BACKWARD_REQUEST,
    "analyze": ANALYZE_REQUEST,
    "attention_rollout": ROLLOUT_REQUEST,
    "sample": SAMPLE_REQUEST,
    "calibrate": CALIBRATE_REQUEST,
    "session_step": SESSION_STEP_REQUEST,
    "model_infer": V2_SOFTMAX_REQUEST,
    "model_version_infer": V2_SOFTMAX_REQUEST,
}
"""Operation id -> the example of its JSON request body."""

STATISTICS = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output", "cache_hit", "cache_miss")
ATTENTION_STATS: dict[str, Any] = {
    "name": "attention",
    "version": "1",
    "last_inference": 1795783120991,
    "inference_count": 3,
    "execution_count": 3,
    "inference_stats": {
        "success": {"count": 3, "ns": 7012465},
        "fail": {"count": 1, "ns": 175229},
        "queue": {"count": 3, "ns": 0},
        "compute_input": {"count": 3, "ns": 4121920},
        "compute_infer": {"count": 3, "ns": 2050668},
        "compute_output": {"count": 3, "ns": 502211},
        "cache_hit": {"count": 0, "ns": 0},
        "cache_miss": {"count": 0, "ns": 0},
    },
    "batch_stats": [],
}
"""Model ``attention`` after three inferences and one refused (a live server, 2026-11-27)."""


def idle_stats(name: str) -> dict[str, Any]:
    """The statistics of a model that has had no inference request."""
    zeros = {statistic: {"count": 0, "ns": 0} for statistic in STATISTICS}
    return {**ATTENTION_STATS, "name": name, "last_inference": 0, "inference_count": 0, "execution_count": 0} | {
        "inference_stats": zeros
    }


RESPONSE_EXAMPLES: dict[str, Any] = {
    "attention": ATTENTION_RESPONSE,
    "softmax": SOFTMAX_RESPONSE,
    "attention_backward": BACKWARD_RESPONSE,
    "analyze": ANALYZE_RESPONSE,
    "attention_rollout": ROLLOUT_RESPONSE,
    "sample": SAMPLE_RESPONSE,
    "calibrate": CALIBRATE_RESPONSE,
    "session_step": SESSION_STEP_RESPONSE,
    "delete_session": SESSION_END_RESPONSE,
    "healthz": {"status": "ok", "version": "0.1.0", "uptime_s": 12.5},
    "readyz": {
        "ready": True,
        "starting": False,
        "stopping": False,
        "engines": {"numpy": True, "onnx": True},
        "status": "ready",
    },
    "engines": ENGINES_RESPONSE,
    "models": {"models": [], "detail": "the ONNX engine is disabled"},
    "server_metadata": {
        "name": "attention-service",
        "version": "0.1.0",
        "extensions": ["binary_tensor_data", "parameters", "statistics", "sequence", "sequence(string_id)"],
    },
    "server_live": {"live": True},
    "server_ready": {"ready": True},
    "model_ready": {"name": "softmax", "ready": True},
    "model_version_ready": {"name": "softmax", "ready": True},
    "model_metadata": MODEL_METADATA,
    "model_version_metadata": MODEL_METADATA,
    "model_infer": V2_SOFTMAX_RESPONSE,
    "model_version_infer": V2_SOFTMAX_RESPONSE,
    "all_model_statistics": {
        "model_stats": [
            ATTENTION_STATS,
            *(
                idle_stats(name)
                for name in (
                    "softmax",
                    "attention_backward",
                    "sample",
                    "calibrate",
                    "attention_session",
                    "attention_rollout",
                )
            ),
        ]
    },
    "model_statistics": {"model_stats": [ATTENTION_STATS]},
    "model_version_statistics": {"model_stats": [ATTENTION_STATS]},
}
"""Operation id -> the example of its 200 JSON answer."""

METRICS_EXAMPLE = (
    "# HELP attention_requests_total Requests answered, by route and status.\n"
    "# TYPE attention_requests_total counter\n"
    'attention_requests_total{route="/v1/attention",status="200"} 42.0\n'
)

PROBLEM_DETAILS: dict[int, str] = {
    400: "the gzip request body is not valid gzip data: Error -3 while decompressing data: incorrect header check",
    401: "this endpoint needs an API key: send 'Authorization: Bearer <key>' or 'X-API-Key: <key>'",
    404: 'sequence 7 is not live: it was never started on this server (sequence_start=true, or "start": true on /v1 on '
    "its first step)",
    413: "the request body is larger than 16777216 bytes",
    415: "Content-Encoding 'br' is not supported; use gzip, deflate or identity",
    422: "temprature: Extra inputs are not permitted",
    500: "the server failed to answer this request; quote request id 1f0c9e7a2b3d4c5e when reporting it",
    503: "too many requests in flight; retry after 1 s",
    504: "the request was not answered within 30 s",
}
"""Status -> the ``detail`` of an example problem+json body (``type`` and ``title`` are the service's own)."""
PROBLEM_ERRORS: dict[int, list[dict[str, Any]]] = {
    422: [{"loc": ["temprature"], "msg": "Extra inputs are not permitted"}],
}

V2_ERROR_EXAMPLES: dict[int, dict[str, str]] = {
    400: {"error": "input 'logits': expected 4 values for shape [1, 4], got 3"},
    401: {"error": "the API key is not valid"},
    404: {"error": "unknown model 'bert'; this server has attention, softmax"},
    413: {"error": "the request body is larger than 16777216 bytes"},
    415: {"error": "Content-Encoding 'br' is not supported; use gzip, deflate or identity"},
    500: {"error": "the server failed to answer this request; quote request id 1f0c9e7a2b3d4c5e when reporting it"},
    503: {"error": "model 'softmax' is not ready: the engines are starting"},
    504: {"error": "the request was not answered within 30 s"},
}
