"""Every limit provoked: body size (413), tensor limits (422), budgets (413), deadline (504), backpressure (503)."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import orjson
import pytest

from service.app import create_app
from service.dataplane.admission import AdmissionGate, Overloaded
from tests.hardening.conftest import (
    ATTENTION,
    SOFTMAX,
    BlockingEngine,
    asgi_scope,
    call_asgi,
    client_for,
    metric_value,
    settings,
)
from tests.http.conftest import assert_problem

# -- body size ---------------------------------------------------------------------------------------------------


def test_body_over_limit_by_content_length_is_413() -> None:
    with client_for(max_body_bytes=4096) as c:
        r = c.post("/v1/softmax", content=b"x" * 5000, headers={"content-type": "application/json"})
        body = assert_problem(r, 413, detail="4096 bytes")
        assert "x" not in body["detail"]
        assert metric_value(c.get("/metrics").text, "attn_http_requests_rejected_total", reason="body_too_large") == 1


def test_body_at_the_limit_is_read() -> None:
    payload = orjson.dumps(SOFTMAX).ljust(2048)  # JSON padded with spaces to exactly the limit
    with client_for(max_body_bytes=2048) as c:
        assert c.post("/v1/softmax", content=payload, headers={"content-type": "application/json"}).status_code == 200


def test_declared_oversized_body_is_refused_before_any_of_it_is_read() -> None:
    app = create_app(settings(max_body_bytes=4096))
    status, headers, body, read = asyncio.run(
        call_asgi(app, [(b"content-type", b"application/json"), (b"content-length", b"1000000")], [b"x" * 65536] * 16)
    )
    assert status == 413 and read == 0
    assert headers["content-type"] == "application/problem+json"


@pytest.mark.parametrize("path", ["/v1/softmax", "/v2/models/attention/infer"])
def test_streamed_body_is_cut_off_at_the_limit(path: str) -> None:
    """A chunked body (no Content-Length) is counted as it arrives: 413 after the chunk that passes the limit."""
    app = create_app(settings(max_body_bytes=100_000))
    app.state.runtime.start_engines()  # ready (no lifespan here), so /v2 reads the body
    status, headers, body, read = asyncio.run(
        call_asgi(app, [(b"content-type", b"application/json")], [b" " * 65536] * 16, path)
    )
    assert status == 413 and read == 2  # 64 KiB, then 128 KiB > 100 000: the other 14 chunks are never read
    error = orjson.loads(body)
    assert error["status"] == 413 if path.startswith("/v1") else set(error) == {"error"}


def test_oversized_body_on_v2_keeps_the_protocol_error_body() -> None:
    with client_for(max_body_bytes=4096) as c:
        r = c.post("/v2/models/attention/infer", content=b"x" * 5000, headers={"content-type": "application/json"})
        assert r.status_code == 413 and r.headers["content-type"] == "application/json"
        assert set(r.json()) == {"error"} and "4096" in r.json()["error"]


# -- tensor limits (422) and budgets (413): enforced by the codecs and api/budget.py, proven here over HTTP ----------


@pytest.mark.parametrize(
    ("overrides", "body", "loc"),
    [
        (
            {"max_rank": 3},
            {**ATTENTION, "query": [[[[1.0, 0.0]]]], "key": [[[[1.0, 0.0]]]], "value": [[[[1.0, 0.0]]]]},
            ["query"],
        ),
        ({"max_dim": 4}, {**ATTENTION, "key": [[1.0, 0.0]] * 5, "value": [[1.0, 2.0]] * 5}, ["key", "shape", 0]),
        ({"max_tensor_elements": 3}, ATTENTION, ["query", "shape"]),
    ],
    ids=["rank", "dim", "elements"],
)
def test_tensor_limits_are_422_naming_the_field(overrides: dict, body: dict, loc: list) -> None:
    with client_for(**overrides) as c:
        assert_problem(c.post("/v1/attention", json=body), 422, loc=loc)


def test_work_budget_is_413() -> None:
    with client_for(max_work_flops=10.0) as c:
        assert_problem(c.post("/v1/attention", json=ATTENTION), 413, detail="estimated work")


def test_response_budget_is_413() -> None:
    big = {"logits": {"shape": [64, 64], "dtype": "float32", "data": [0.0] * 4096}}
    with client_for(max_response_bytes=1024) as c:
        assert_problem(c.post("/v1/softmax", json=big), 413, detail="estimated response size")


# -- deadline (504) ------------------------------------------------------------------------------------------------


def test_deadline_answers_504_while_the_work_goes_on_and_keeps_its_slot() -> None:
    """Driven at the ASGI level: TestClient returns only once the app has returned, while a server
    sends the 504 the moment the app does (test_shutdown.py checks that on a live server).
    """
    engine = BlockingEngine()
    app = create_app(
        settings(
            request_timeout_s=0.3,
            queue_timeout_s=0.1,
            max_concurrent_requests=1,
            max_queued_requests=0,
            inline_max_body_bytes=0,
        ),
        engines={"numpy": engine},
    )
    body = orjson.dumps(ATTENTION)

    async def scenario() -> None:
        answered = asyncio.Event()
        sent: list[dict] = []

        async def send(message: dict) -> None:
            sent.append(message)
            if not message.get("more_body", False) and message["type"] == "http.response.body":
                answered.set()

        async def receive() -> dict:
            return {"type": "http.request", "body": body, "more_body": False}

        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        t0 = time.monotonic()
        first = asyncio.ensure_future(app(asgi_scope("/v1/attention", headers), receive, send))
        # answered at the deadline (0.3 s), while the engine stays blocked until released below: however busy the
        # machine, an answer that waited for the work would never come
        await asyncio.wait_for(answered.wait(), 10.0)
        assert 0.25 < time.monotonic() - t0 < 10.0
        assert sent[0]["status"] == 504 and orjson.loads(sent[1]["body"])["detail"].startswith(
            "the request was not answered"
        )
        assert not engine.finished.is_set() and not first.done()  # ... while the work goes on
        status, _, _, _ = await call_asgi(app, headers, [body], "/v1/attention")
        assert status == 503  # abandoned work keeps its slot, so it cannot pile up
        engine.release.set()
        await asyncio.wait_for(first, 5.0)
        assert len(sent) == 2  # the late answer was dropped
        status, _, _, _ = await call_asgi(app, headers, [body], "/v1/attention")
        assert status == 200
        metrics = (await call_asgi(app, [], [b""], "/metrics", "GET"))[2].decode()
        assert metric_value(metrics, "attn_http_requests_rejected_total", reason="deadline") == 1
        assert (
            metric_value(metrics, "attn_http_requests_total", method="POST", route="/v1/attention", status="504") == 1
        )
        assert metric_value(metrics, "attn_http_requests_in_flight") == 0

    asyncio.run(scenario())


def wait_ready(c: Any) -> None:
    """Until the app's engines are ready (a /v2 inference is refused 503 before that)."""
    deadline = time.monotonic() + 30
    while c.get("/readyz").status_code != 200:
        assert time.monotonic() < deadline, "the app never became ready"
        time.sleep(0.02)


def test_deadline_on_v2_keeps_the_protocol_error_body() -> None:
    with client_for(request_timeout_s=0.2, queue_timeout_s=0.1, debug_delay_s=0.5) as c:
        wait_ready(c)  # a model not yet ready is a 503, before any delay
        logits = {"name": "logits", "shape": [2], "datatype": "FP64", "data": [1.0, 2.0]}
        r = c.post("/v2/models/softmax/infer", json={"inputs": [logits]})  # the debug delay is inference's
        assert r.status_code == 504 and set(r.json()) == {"error"}
        time.sleep(0.4)  # let the delayed request end inside the client's event loop


# -- backpressure (503) --------------------------------------------------------------------------------------------


def test_past_the_queue_requests_get_503_with_retry_after_at_once_and_probes_still_answer() -> None:
    engine = BlockingEngine()
    with client_for(
        engine, max_concurrent_requests=1, max_queued_requests=1, queue_timeout_s=5.0, retry_after_s=7
    ) as c:
        with ThreadPoolExecutor(2) as pool:
            first = pool.submit(c.post, "/v1/attention", json=ATTENTION)
            assert engine.started.acquire(timeout=5)  # the first request holds the only slot
            second = pool.submit(c.post, "/v1/attention", json=ATTENTION)  # waits in the queue
            for _ in range(100):
                if metric_value(c.get("/metrics").text, "attn_http_requests_queued") == 1:
                    break
                time.sleep(0.02)
            t0 = time.monotonic()
            third = c.post("/v1/softmax", json=SOFTMAX)
            assert time.monotonic() - t0 < 2.5  # refused at once, not after the 5 s queue timeout
            body = assert_problem(third, 503, detail="capacity")
            assert third.headers["retry-after"] == "7"
            assert body["type"].endswith("/unavailable")
            for path in ("/healthz", "/readyz", "/metrics"):  # exempt: never queued
                assert c.get(path).status_code == 200, path
            engine.release.set()
            assert first.result(10).status_code == 200
            assert second.result(10).status_code == 200  # the queued request got the slot
        metrics = c.get("/metrics").text
        assert metric_value(metrics, "attn_http_requests_rejected_total", reason="queue_full") == 1
        assert metric_value(metrics, "attn_http_queue_wait_seconds_count") == 2


def test_a_queued_request_gets_503_after_the_queue_timeout() -> None:
    engine = BlockingEngine()
    with client_for(engine, max_concurrent_requests=1, max_queued_requests=4, queue_timeout_s=0.2) as c:
        with ThreadPoolExecutor(1) as pool:
            first = pool.submit(c.post, "/v1/attention", json=ATTENTION)
            assert engine.started.acquire(timeout=5)
            t0 = time.monotonic()
            r = c.post("/v1/softmax", json=SOFTMAX)
            assert 0.15 < time.monotonic() - t0 < 10.0  # after the 0.2 s queue timeout (the engine stays blocked)
            assert_problem(r, 503)
            assert r.headers["retry-after"] == "1"
            engine.release.set()
            assert first.result(10).status_code == 200
        metrics = c.get("/metrics").text
        assert metric_value(metrics, "attn_http_requests_rejected_total", reason="queue_timeout") == 1


def test_backpressure_on_v2_keeps_the_protocol_error_body() -> None:
    engine = BlockingEngine()
    with client_for(engine, max_concurrent_requests=1, max_queued_requests=0) as c, ThreadPoolExecutor(1) as pool:
        wait_ready(c)  # else the /v2 request below may be refused as not ready (503 too, another Retry-After)
        first = pool.submit(c.post, "/v1/attention", json=ATTENTION)
        assert engine.started.acquire(timeout=5)
        logits = {"name": "logits", "shape": [2], "datatype": "FP64", "data": [1.0, 2.0]}
        r = c.post("/v2/models/softmax/infer", json={"inputs": [logits]})
        assert r.status_code == 503 and set(r.json()) == {"error"} and r.headers["retry-after"] == "1"
        assert c.get("/v2/health/live").status_code != 503  # an exempt probe is never refused for load
        assert c.get("/v2/models/attention").status_code == 200  # nor metadata: only inference is admitted
        engine.release.set()
        assert first.result(10).status_code == 200


def test_admission_gate_hands_slots_over_in_order_and_survives_cancellation() -> None:
    async def scenario() -> None:
        changes: list[tuple[int, int]] = []
        gate = AdmissionGate(1, 2, 5.0, on_change=lambda a, q: changes.append((a, q)))
        await gate.acquire()
        order: list[str] = []

        async def waiter(name: str) -> None:
            await gate.acquire()
            order.append(name)

        a = asyncio.ensure_future(waiter("a"))
        b = asyncio.ensure_future(waiter("b"))
        c = asyncio.ensure_future(waiter("c"))
        await asyncio.sleep(0.01)
        assert gate.queued == 2
        with pytest.raises(Overloaded) as exc:
            await c
        assert exc.value.reason == "queue_full"
        a.cancel()  # a leaves the queue: b is next
        await asyncio.sleep(0.01)
        assert gate.queued == 1
        gate.release()
        await b
        assert order == ["b"] and gate.active == 1 and gate.queued == 0
        gate.release()
        assert gate.active == 0 and changes[-1] == (0, 0)

    asyncio.run(scenario())
