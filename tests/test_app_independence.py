"""Two apps in one process are independent (issue 29 item 4): each keeps its own limits, memory budget, cost model
and heap trimmer, whichever was built last, and nothing one app's factory sets reaches the other.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import numpy as np
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from service.app import create_app
from service.core.attention import Dims
from service.core.types import AttentionInputs, AttentionParams, AttentionTask
from service.dataplane import DataPlane, budget
from service.engines.cost import REFERENCE
from service.settings import Settings


def app(**settings: Any) -> FastAPI:
    return create_app(Settings(enable_onnx=False, grpc_enabled=False, **settings))


def plane(of: FastAPI) -> DataPlane:
    found = of.state.plane
    assert isinstance(found, DataPlane)
    return found


def b64(a: np.ndarray) -> dict[str, Any]:
    a = np.ascontiguousarray(a, dtype="<f4")
    return {"shape": list(a.shape), "dtype": "float32", "b64": base64.b64encode(a.tobytes()).decode()}


def attention_body(n: int, **fields: Any) -> dict[str, Any]:
    column = b64(np.full((1, 1, n, 1), 0.01))  # every key a candidate of sparsemax's support: its worst case
    return {"query": column, "key": column, "value": column, **fields}


GRADIENTS = ("grad_query", "grad_key", "grad_value")


def caps(n: int) -> dict[str, float]:
    """Per path, twice the reference model's work of sparsemax over (1, 1, n, n), E = 1: a cap that the reference
    admits and a model with ``sparsemax=4`` refuses.
    """
    dims = Dims(B=1, Hq=1, Hkv=1, L=n, S=n, E=1, Ev=1)
    forward, _ = budget.attention_estimate(dims, "sparsemax", {"output"}, "float32", "json", costs=REFERENCE)
    backward, _ = budget.backward_estimate(dims, "sparsemax", GRADIENTS, "float32", "json", costs=REFERENCE)
    return {"/v1/attention": 2 * forward, "/v1/attention/backward": 2 * backward}


@pytest.fixture
def clients() -> Iterator[tuple[TestClient, TestClient]]:
    """A small app (work cap 1e8, memory budget 4 MiB, sparsemax priced 4x) and a default one, both serving."""
    small = app(max_work_flops=1e8, max_body_bytes=1 << 20, memory_budget_bytes=4 << 20, cost_calibration="sparsemax=4")
    default = app(cost_calibration="off")
    with ExitStack() as stack:
        yield stack.enter_context(TestClient(small)), stack.enter_context(TestClient(default))


def test_each_plane_holds_its_own_parts(clients: tuple[TestClient, TestClient]) -> None:
    small, default = (plane(c.app) for c in clients)
    assert small.settings.max_work_flops == 1e8 and default.settings.max_work_flops == 2e11
    assert small.context.budget.max_work_flops == 1e8 and default.context.budget.max_work_flops == 2e11
    assert small.memory.capacity == 4 << 20 and default.memory.capacity == 1 << 30
    assert small.body_share.capacity == 2 << 20 and default.body_share.capacity == 512 << 20
    assert dict(small.costs.factors) == {"sparsemax": 4.0} and dict(default.costs.factors) == {}
    for each in (small, default):
        assert each.context.costs is each.costs
        assert all(engine.cost_model is each.costs for engine in each.runtime.engines.values())
    assert small.trimmer is not default.trimmer
    assert small.admission is not default.admission and small.scheduler is not default.scheduler


def test_each_app_refuses_by_its_own_limits(clients: tuple[TestClient, TestClient]) -> None:
    small, default = clients
    work = attention_body(2048, **{"return": ["output"]})  # 1.3e9 GEMM-equivalent operations
    r = small.post("/v1/attention", json=work)
    assert r.status_code == 413 and "exceeds the limit of 1e+08" in r.json()["detail"], r.text[:300]
    assert default.post("/v1/attention", json=work).status_code == 200
    memory = attention_body(512, **{"return": ["output", "weights"]})  # 8e7 operations, 18 MiB
    r = small.post("/v1/attention", json=memory)
    assert r.status_code == 413 and "budget of 4.0 MiB (ATTN_MEMORY_BUDGET_BYTES)" in r.json()["detail"], r.text[:300]
    assert default.post("/v1/attention", json=memory).status_code == 200
    assert plane(small.app).memory.reserved == 0 and plane(default.app).memory.reserved == 0


def test_each_apps_engines_price_with_its_own_calibration() -> None:
    pinned = plane(app(cost_calibration="sparsemax=4"))
    plain = plane(app(cost_calibration="off"))  # built last: nothing of it reaches the first
    column = np.full((1, 1, 512, 1), 0.01, dtype=np.float32)
    task = AttentionTask(
        inputs=AttentionInputs(query=column, key=column, value=column),
        params=AttentionParams(normalizer="sparsemax"),
        dtype=np.dtype(np.float32),
        need_weights=False,
        need_scores=False,
    )
    slow = pinned.runtime.engines["numpy"].cost(task)
    fast = plain.runtime.engines["numpy"].cost(task)
    assert slow.work_flops > caps(512)["/v1/attention"] > fast.work_flops
    dims = Dims(B=1, Hq=1, Hkv=1, L=512, S=512, E=1, Ev=1)
    options = {"alpha": None, "dtype": "float32", "need_weights": False, "need_scores": False}
    assert pinned.context.costs.numpy_cost(dims, normalizer="sparsemax", **options) == slow
    assert plain.context.costs.numpy_cost(dims, normalizer="sparsemax", **options) == fast


@pytest.mark.parametrize(
    ("path", "pinned_first"),
    [
        ("/v1/attention", True),  # the engine's own estimate, the pinned app's, refuses it
        ("/v1/attention", False),
        ("/v1/attention/backward", True),
        ("/v1/attention/backward", False),
    ],
)
def test_each_app_prices_requests_by_its_own_calibration(path: str, pinned_first: bool) -> None:
    """The same cap on both; sparsemax priced 4x on one: refused there, answered on the other, in either order."""
    n = 512
    order = ("sparsemax=4", "off") if pinned_first else ("off", "sparsemax=4")
    built = {calibration: app(max_work_flops=caps(n)[path], cost_calibration=calibration) for calibration in order}
    body = attention_body(n, normalizer="sparsemax", **{"return": ["output"]})
    if path.endswith("backward"):
        grad_output = b64(np.ones((1, 1, n, 1)))
        body = attention_body(n, normalizer="sparsemax", grad_output=grad_output, **{"return": list(GRADIENTS)})
    with TestClient(built["sparsemax=4"]) as pinned, TestClient(built["off"]) as plain:
        r = pinned.post(path, json=body)
        assert r.status_code == 413 and "estimated work" in r.json()["detail"], r.text[:300]
        r = plain.post(path, json=body)
        assert r.status_code == 200, r.text[:300]


def test_an_app_that_stops_leaves_the_others_trimmer_running() -> None:
    first, second = app(), app()
    with TestClient(second):
        with TestClient(first):
            pass  # the first app starts and stops: its trimmer's thread ends
        trimmer = plane(second).trimmer
        trimmed = trimmer.trims
        trimmer.request()
        deadline = time.monotonic() + 5
        while trimmer.trims == trimmed and time.monotonic() < deadline:
            time.sleep(0.02)
        assert trimmer.trims == trimmed + 1
