"""The cases of ``bench/bench_http.py``: their names, the request bodies, and what each measured."""

from __future__ import annotations

import base64
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

SMALL, LARGE = (1, 1, 4, 4), (1, 8, 128, 64)
BARE_POST = "bare FastAPI POST (HTTP floor)"
BARE_GET = "bare FastAPI GET"
LIVE_GET = "service GET /v2/health/live"
HEALTHZ = "service GET /healthz"
BARE_MEDIUM_JSON = "bare FastAPI POST, medium /v2 JSON sizes (transport floor)"
BARE_TINY_MATHS = "bare app POST (a Starlette route), tiny /v2 JSON computed with service.core (numerics floor)"
TARGET_CASES = (
    HEALTHZ,
    f"/v1 {SMALL} lists",
    f"/v2 {SMALL} JSON",
    f"/v2 {SMALL} binary",
    BARE_TINY_MATHS,
    f"/v2 {LARGE} JSON",
    f"/v2 {LARGE} binary",
    BARE_MEDIUM_JSON,
)
"""The cases of issue 8's targets and their floors, measured again in each extra round (``--rounds``)."""


def tensors(shape: tuple[int, ...]) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.standard_normal(shape).astype(np.float32) for _ in range(3)]


def v1_body(shape: tuple[int, ...], form: str, diagnostics: bool = True) -> bytes:
    q, k, v = tensors(shape)

    def wire(a: np.ndarray) -> Any:
        if form == "lists":
            return a.tolist()
        if form == "flat":
            return {"shape": list(a.shape), "dtype": "float32", "data": a.reshape(-1).tolist()}
        return {"shape": list(a.shape), "dtype": "float32", "b64": base64.b64encode(a.tobytes()).decode()}

    body: dict[str, Any] = {"query": wire(q), "key": wire(k), "value": wire(v)}
    body["return"] = ["output", "weights"] + (["diagnostics"] if diagnostics else [])
    if form == "b64":
        body["encoding"] = "base64"
    return orjson.dumps(body)


def v2_body(shape: tuple[int, ...], binary: bool) -> tuple[bytes, dict[str, str]]:
    arrays = dict(zip(("query", "key", "value"), tensors(shape), strict=True))
    inputs = []
    for name, a in arrays.items():
        spec: dict[str, Any] = {"name": name, "shape": list(a.shape), "datatype": "FP32"}
        if binary:
            spec["parameters"] = {"binary_data_size": a.nbytes}
        else:
            spec["data"] = a.reshape(-1)
        inputs.append(spec)
    outputs = [{"name": n, "parameters": {"binary_data": binary}} for n in ("output", "weights")]
    header = orjson.dumps({"inputs": inputs, "outputs": outputs}, option=orjson.OPT_SERIALIZE_NUMPY)
    if not binary:
        return header, {"Content-Type": "application/json"}
    body = header + b"".join(a.tobytes() for a in arrays.values())
    return body, {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(len(header))}


@dataclass
class Case:
    name: str
    path: str
    body: bytes
    headers: dict[str, str]
    inproc: Callable[[], dict[str, float]] | None = None
    bare: bool = False
    method: str = "POST"
    e2e: dict[str, Any] = field(default_factory=dict)
    e2e_c: dict[str, Any] = field(default_factory=dict)
    local: dict[str, float] = field(default_factory=dict)
    response_bytes: int = 0
    p50s: list[float] = field(default_factory=list)
    """p50 (ms, one connection) of each round: the first pass, then the extra rounds of the tiny targets."""

    @property
    def p50(self) -> float:
        """The median of the rounds' p50s (ms)."""
        return statistics.median(self.p50s)
