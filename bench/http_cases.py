"""The cases of ``python -m bench http`` (``bench/bench_http.py``): their names, the request bodies, and what each
measured.
"""

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
EDGE_TINY_MATHS = "the service's HTTP edge, the bare app's maths as its /v2 job (edge floor)"
TARGET_CASES = (
    HEALTHZ,
    f"/v1 {SMALL} lists",
    f"/v2 {SMALL} JSON",
    f"/v2 {SMALL} binary",
    BARE_TINY_MATHS,
    EDGE_TINY_MATHS,
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
    server: str = "service"
    """Which server answers: ``service``, ``bare`` (bench/http_bare_app.py) or ``edge`` (bench/http_edge_floor.py)."""
    method: str = "POST"
    e2e: dict[str, Any] = field(default_factory=dict)
    e2e_c: dict[str, Any] = field(default_factory=dict)
    local: dict[str, float] = field(default_factory=dict)
    response_bytes: int = 0
    p50s: list[float] = field(default_factory=list)
    """p50 (ms, one connection) of each round: the first pass, then the extra rounds of the targets' cases."""

    @property
    def p50(self) -> float:
        """The median of the rounds' p50s (ms)."""
        return statistics.median(self.p50s)


V1Run = Callable[[bytes], Callable[[], dict[str, float]]]
V2Run = Callable[[bytes, dict[str, str]], Callable[[], dict[str, float]]]


def build_cases(v1_run: V1Run, v2_run: V2Run, medium_answer_bytes: int) -> list[Case]:
    """Every case, in the order they run: the floors, then /v1 and /v2 per shape, then the two floors of the tiny
    request and the medium transport floor.

    ``v1_run`` and ``v2_run`` make each request's in-process run; ``medium_answer_bytes`` is the length of the
    service's answer to the medium /v2 JSON request (the bare app answers as many bytes).
    """
    small_v1 = v1_body(SMALL, "lists")
    cases = [
        Case(BARE_GET, "/bare", b"", {}, server="bare", method="GET"),
        Case(LIVE_GET, "/v2/health/live", b"", {}, method="GET"),
        Case(HEALTHZ, "/healthz", b"", {}, method="GET"),
        Case(BARE_POST, "/bare", small_v1, {"Content-Type": "application/json"}, server="bare"),
    ]
    for shape in (SMALL, LARGE):
        for form in ("lists", "flat", "b64"):
            body = v1_body(shape, form)
            cases.append(
                Case(f"/v1 {shape} {form}", "/v1/attention", body, {"Content-Type": "application/json"}, v1_run(body))
            )
        if shape == SMALL:
            body = v1_body(shape, "lists", diagnostics=False)
            cases.append(
                Case(
                    f"/v1 {shape} lists, no diagnostics",
                    "/v1/attention",
                    body,
                    {"Content-Type": "application/json"},
                    v1_run(body),
                )
            )
        for binary in (False, True):
            body, headers = v2_body(shape, binary)
            cases.append(
                Case(
                    f"/v2 {shape} {'binary' if binary else 'JSON'}",
                    "/v2/models/attention/infer",
                    body,
                    headers,
                    v2_run(body, headers),
                )
            )

    # The tiny /v2 JSON request computed by the bare app with the service's maths and nothing else.
    tiny_json, _ = v2_body(SMALL, False)
    cases.append(
        Case(BARE_TINY_MATHS, "/bare/attention", tiny_json, {"Content-Type": "application/json"}, server="bare")
    )
    # The same answer inside the service's HTTP edge: everything the service does but the job's own layers.
    cases.append(
        Case(
            EDGE_TINY_MATHS,
            "/v2/models/attention/infer",
            tiny_json,
            {"Content-Type": "application/json"},
            server="edge",
        )
    )

    # The transport of the medium /v2 JSON request and answer alone: the bare app reads that body and
    # answers as many bytes as the service does.
    medium_json, _ = v2_body(LARGE, False)
    cases.append(
        Case(
            BARE_MEDIUM_JSON,
            f"/bare/sized?n={medium_answer_bytes}",
            medium_json,
            {"Content-Type": "application/json"},
            server="bare",
        )
    )
    return cases
