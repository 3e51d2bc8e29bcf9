"""Honest budgets: work by what the normalizer really costs, memory per engine and for the whole process."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.core.attention import run_attention
from service.core.types import AttentionResult, AttentionTask
from service.dataplane.errors import Kind, ServiceError
from service.dataplane.memory import MemoryBudget, MemoryLease
from service.engines.cost import Cost
from service.engines.numpy_engine import NumpyEngine
from service.settings import Settings
from tests.http.conftest import assert_problem
from tests.http.test_attention_http import b64, decode


def _column(n: int) -> dict[str, Any]:
    return {"shape": [1, 1, n, 1], "dtype": "float32", "data": [float(i % 7) / 7 for i in range(n)]}


# -- the process-wide budget -------------------------------------------------------------------------------------


def test_budget_refuses_what_can_never_fit_and_waits_for_room() -> None:
    budget = MemoryBudget(100, wait_s=0.05)
    with pytest.raises(ServiceError) as never:
        budget.acquire(101)
    assert never.value.kind is Kind.TOO_LARGE and "ATTN_MEMORY_BUDGET_BYTES" in never.value.message
    budget.acquire(60)
    with pytest.raises(ServiceError) as busy:
        budget.acquire(50)
    assert busy.value.kind is Kind.UNAVAILABLE and busy.value.retry_after_s == 1
    assert budget.reserved == 60

    got = threading.Event()
    slow = MemoryBudget(100, wait_s=5.0)
    slow.acquire(60)

    def waiter() -> None:
        slow.acquire(50)
        got.set()

    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(0.05)
    assert not got.is_set()  # waiting for room
    slow.release(60)
    t.join(5)
    assert got.is_set() and slow.reserved == 50


def test_a_lease_gives_everything_back_when_the_work_ends() -> None:
    budget = MemoryBudget(1000, wait_s=0.0)
    with budget.lease() as lease:
        assert isinstance(lease, MemoryLease)
        lease.reserve(300)
        lease.reserve(200)
        assert budget.reserved == 500
    assert budget.reserved == 0
    with pytest.raises(RuntimeError), budget.lease() as lease:
        lease.reserve(100)
        raise RuntimeError("the work failed")
    assert budget.reserved == 0


# -- work and memory through HTTP --------------------------------------------------------------------------------


@pytest.fixture
def numpy_client() -> Iterator[TestClient]:
    with TestClient(create_app(Settings(enable_onnx=False)), raise_server_exceptions=False) as c:
        yield c


def test_bisection_entmax_at_8192_keys_is_refused_for_its_work(numpy_client: TestClient) -> None:
    """The issue's request: (1, 1, 8192, 1) entmax alpha 1.3 passed the old flop count and ran 28 s."""
    col = _column(8192)
    body = {"query": col, "key": col, "value": col, "normalizer": "entmax", "alpha": 1.3, "return": ["output"]}
    r = numpy_client.post("/v1/attention", json=body)
    problem = assert_problem(r, 413, detail="estimated work")
    assert "core-seconds" in problem["detail"]


def test_auto_skips_an_engine_over_the_memory_budget(tmp_path: Any) -> None:
    """ReLU on ONNX materialises the scores several times; under a budget that only numpy fits,
    auto runs numpy and says why, and a request naming onnx is refused with 413.
    """
    with TestClient(create_app(Settings(memory_budget_bytes=96 << 20)), raise_server_exceptions=False) as c:
        deadline = time.monotonic() + 60
        while c.get("/readyz").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        col = _column(2048)
        # relu: ONNX first under auto (sparsemax now goes to numpy first by speed, see test_dispatch)
        body = {"query": col, "key": col, "value": col, "normalizer": "relu", "return": ["output"]}
        r = c.post("/v1/attention", json=body)
        assert r.status_code == 200, r.text
        engine = r.json()["engine"]
        assert engine["name"] == "numpy"
        assert "onnx is over a limit" in engine["reason"] and "estimated memory" in engine["reason"]
        named = c.post("/v1/attention", json={**body, "engine": "onnx"})
        assert_problem(named, 413, detail="ATTN_MEMORY_BUDGET_BYTES")
        # The same request within the budget's reach on ONNX runs there.
        small = _column(256)
        ok = c.post("/v1/attention", json={**body, "query": small, "key": small, "value": small, "engine": "onnx"})
        assert ok.status_code == 200 and ok.json()["engine"]["name"] == "onnx"


class _GreedyEngine(NumpyEngine):
    """numpy, claiming a large peak and taking its time, recording the budget it saw in use."""

    def __init__(self, peak: int, budget_of: Any) -> None:
        super().__init__(threads=1)
        self.peak = peak
        self.budget_of = budget_of
        self.seen: list[int] = []

    def cost(self, task: AttentionTask) -> Cost:
        return Cost(seconds=1e-6, peak_bytes=self.peak)

    def run(self, task: AttentionTask) -> AttentionResult:
        self.seen.append(self.budget_of().reserved)
        time.sleep(0.2)
        return run_attention(task)


def test_concurrent_requests_within_limits_never_exceed_the_budget() -> None:
    """Four concurrent requests whose estimates fit the budget one at a time: never two at once."""
    capacity = 64 << 20
    holder: dict[str, Any] = {}
    engine = _GreedyEngine(40 << 20, lambda: holder["app"].state.plane.memory)
    settings = Settings(enable_onnx=False, memory_budget_bytes=capacity, queue_timeout_s=5.0, inline_max_body_bytes=0)
    app = create_app(settings, engines={"numpy": engine})
    holder["app"] = app
    rng = np.random.default_rng(0)
    q = rng.standard_normal((4, 8)).tolist()
    body = {"query": q, "key": q, "value": q, "return": ["output"]}
    statuses: list[int] = []
    with TestClient(app, raise_server_exceptions=False) as c:

        def send() -> None:
            statuses.append(c.post("/v1/attention", json=body).status_code)

        threads = [threading.Thread(target=send) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert app.state.plane.memory.reserved == 0  # everything given back
    assert statuses == [200] * 4
    assert len(engine.seen) == 4
    assert max(engine.seen) <= capacity
    assert all(seen >= 40 << 20 for seen in engine.seen)  # each ran holding its own reservation


def test_an_output_only_request_is_priced_without_its_scores() -> None:
    """Issue 32: an output-only softmax request holds no ``(L, S)`` scores on either engine (numpy's row chunks, the
    flash graph), so a memory budget far below its scores serves it; asking for the weights, which are ``(L, S)``,
    is refused by the same budget, naming ATTN_MEMORY_BUDGET_BYTES.
    """
    rng = np.random.default_rng(3)
    B, H, L, E = 1, 4, 2048, 16  # 16.8M scores: 64 MiB of float32 weights; inputs and output 1.5 MiB
    tensors = {n: rng.standard_normal((B, H, L, E)).astype(np.float32) for n in ("query", "key", "value")}
    body = {n: b64(a, "float32") for n, a in tensors.items()}
    settings = Settings(memory_budget_bytes=48 << 20, max_work_flops=1e12, max_response_bytes=256 << 20)
    with TestClient(create_app(settings), raise_server_exceptions=False) as c:
        for engine in ("numpy", "onnx", "auto"):
            r = c.post("/v1/attention", json={**body, "return": ["output"], "engine": engine, "encoding": "base64"})
            assert r.status_code == 200, (engine, r.text)
            assert decode(r.json()["output"]).shape == (B, H, L, E)
        both = {**body, "return": ["output", "weights"], "engine": "numpy", "encoding": "base64"}
        r = c.post("/v1/attention", json=both)
        assert_problem(r, 413, detail="ATTN_MEMORY_BUDGET_BYTES")
