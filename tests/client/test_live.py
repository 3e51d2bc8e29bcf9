"""The client against live servers: numbers equal to the core, identity encoding on the wire, retries,
every error class, and the async client under concurrency.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import numpy as np
import pytest
from attention_client import (
    AsyncAttentionClient,
    AttentionClient,
    AuthenticationError,
    OverloadedError,
    PayloadTooLargeError,
    RetryPolicy,
    ServiceError,
    TransportError,
    ValidationError,
)

from service.core.attention import attention
from service.core.types import AttentionParams
from tests.e2e.conftest import LiveServer, free_port
from tests.live import API_KEY

pytestmark = pytest.mark.slow

ROW2 = [2.1, 0.5, -1.2, 3.0]


@pytest.fixture
def client(keyed_server: LiveServer) -> Any:
    with AttentionClient(keyed_server.url, api_key=API_KEY) as c:
        yield c


def test_attention_equals_the_core(client: AttentionClient) -> None:
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((1, 4, 6, 8)), rng.standard_normal((1, 2, 7, 8)), rng.standard_normal((1, 2, 7, 3))
    r = client.attention(
        q,
        k,
        v,
        causal="bottom_right",
        normalizer="entmax15",
        precision="float64",
        returns=["output", "weights", "scores", "diagnostics"],
    )
    ref = attention(q, k, v, params=AttentionParams(normalizer="entmax15", causal="bottom_right"), dtype=np.float64)
    assert r.output is not None and r.weights is not None and r.scores is not None and r.diagnostics is not None
    assert r.output.dtype == np.float64 and r.output.flags.writeable
    np.testing.assert_allclose(r.output, ref.output, atol=1e-12)
    np.testing.assert_allclose(r.weights, ref.weights, atol=1e-12)
    # bottom_right with L=6, S=7: query 0 sees keys 0 and 1; masked scores come back as -inf
    assert np.isfinite(r.scores[0, 0, 0, :2]).all() and np.isneginf(r.scores[0, 0, 0, 2:]).all()
    assert r.engine is not None and r.engine.name == "numpy" and r.engine.provider
    assert len(r.diagnostics["heads"]) == 4 and r.timing_ms["total"] > 0
    assert r.request_id and len(r.request_id) >= 16


def test_float32_in_float32_out_and_only_what_was_asked(client: AttentionClient) -> None:
    q = np.eye(3, 4, dtype=np.float32)
    r = client.attention(q, q, q, returns=["output"])
    assert r.output is not None and r.output.dtype == np.float32 and r.output.shape == (3, 4)
    assert r.weights is None and r.scores is None and r.diagnostics is None


def test_softmax_reference_numbers(client: AttentionClient) -> None:
    r = client.softmax(np.array([ROW2]), log=True, precision="float64")
    np.testing.assert_allclose(r.probabilities, [[0.2704, 0.0546, 0.0100, 0.6650]], atol=1e-4)
    assert r.log_probabilities is not None
    np.testing.assert_allclose(r.log_probabilities, [[-1.3079, -2.9079, -4.6079, -0.4079]], atol=1e-4)
    np.testing.assert_allclose(r.diagnostics["entropy"], [0.8296], atol=1e-4)
    t2 = client.softmax(ROW2, temperature=2.0, precision="float64")
    np.testing.assert_allclose(t2.probabilities, [0.3116, 0.1400, 0.0598, 0.4886], atol=1e-4)
    sparse = client.softmax(ROW2, normalizer="sparsemax", precision="float64")
    np.testing.assert_allclose(sparse.probabilities, [0.05, 0, 0, 0.95], atol=1e-12)
    assert client.softmax(ROW2).probabilities.dtype == np.float32


def test_the_request_id_is_sent_and_returned(client: AttentionClient) -> None:
    assert client.softmax([1.0, 2.0], request_id="my-trace-0001").request_id == "my-trace-0001"


def test_operations(client: AttentionClient) -> None:
    assert client.ready() is True
    assert client.health()["status"] == "ok"
    assert [e["name"] for e in client.engines()["engines"]] == ["numpy"]
    assert client.models()["models"] == []


def _recording_http(url: str) -> tuple[httpx.Client, list[httpx.Response]]:
    seen: list[httpx.Response] = []
    return httpx.Client(base_url=url, event_hooks={"response": [seen.append]}), seen


def test_identity_encoding_unless_compression_is_asked(keyed_server: LiveServer) -> None:
    q = np.random.default_rng(1).standard_normal((1, 2, 64, 64)).astype(np.float32)  # ~100 kB answer: over gzip_min
    http, seen = _recording_http(keyed_server.url)
    with http, AttentionClient(api_key=API_KEY, http=http) as plain:
        plain.attention(q, q, q)
        assert seen[-1].request.headers["accept-encoding"] == "identity"
        assert "content-encoding" not in seen[-1].headers
    http, seen = _recording_http(keyed_server.url)
    with http, AttentionClient(api_key=API_KEY, http=http, compression=True) as gz:
        r = gz.attention(q, q, q)
        assert seen[-1].headers["content-encoding"] == "gzip"
    assert r.output is not None and r.output.shape == q.shape


def test_validation_error_names_the_field(client: AttentionClient) -> None:
    with pytest.raises(ValidationError) as info:
        client.attention(np.ones((2, 4)), np.ones((2, 3)), np.ones((2, 3)))
    err = info.value
    assert err.status == 422 and "E=3" in err.detail and err.title
    assert err.request_id and err.problem["status"] == 422
    with pytest.raises(ValidationError) as info:
        client.softmax([1.0, 2.0], normalizer="entmax", alpha=0.5)
    assert [e["loc"] for e in info.value.errors] == [["alpha"]]


def test_missing_or_wrong_api_key(keyed_server: LiveServer) -> None:
    for key in ("", "wrong-key-wrong-key-wrong"):
        with AttentionClient(keyed_server.url, api_key=key) as c, pytest.raises(AuthenticationError) as info:
            c.softmax([1.0, 2.0])
        assert info.value.status == 401 and "API key" in info.value.detail
        assert info.value.headers["www-authenticate"].startswith("Bearer")


def test_api_key_from_the_environment(keyed_server: LiveServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ATTENTION_API_KEY", API_KEY)
    with AttentionClient(keyed_server.url) as c:
        assert c.softmax([0.0, 0.0]).probabilities.tolist() == [0.5, 0.5]


def test_payload_too_large(client: AttentionClient) -> None:
    big = np.zeros((600, 512), np.float32)  # 1.2 MB of float32, over the 1 MiB body limit
    with pytest.raises(PayloadTooLargeError) as info:
        client.softmax(big)
    assert info.value.status == 413 and info.value.detail


def test_connection_refused_is_retried_then_raised() -> None:
    attempts: list[float] = []
    policy = RetryPolicy(max_retries=2, backoff_s=0.01)
    with AttentionClient(f"http://127.0.0.1:{free_port()}", retry=policy, timeout=2.0) as c:
        c._sleep = attempts.append  # type: ignore[method-assign]
        with pytest.raises(TransportError) as info:
            c.softmax([1.0])
    assert len(attempts) == 2 and all(0 <= a <= 0.02 for a in attempts)
    assert info.value.status is None and "ConnectError" in info.value.detail and not info.value.timed_out
    assert isinstance(info.value, ServiceError)


@contextmanager
def _saturated(server: LiveServer) -> Iterator[threading.Event]:
    """Two threads keep the busy server's only slot taken (each request holds it 1.5 s) until the event is set;
    entered once a probe was refused, so the slot is taken from then on.
    """
    stop = threading.Event()

    def hammer() -> None:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            while not stop.is_set():
                http.post("/v1/softmax", json={"logits": [1.0, 2.0]})

    threads = [threading.Thread(target=hammer) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        seen = []
        with httpx.Client(base_url=server.url, timeout=30) as http:
            for _ in range(100):
                seen.append(http.post("/v1/softmax", json={"logits": [1.0]}).status_code)
                if seen[-1] == 503:
                    break
        assert seen[-1] == 503, f"the busy server never refused: {seen}"
        yield stop
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)


def test_503_is_retried_honouring_retry_after(busy_server: LiveServer) -> None:
    waits: list[float] = []
    with _saturated(busy_server) as stop:
        statuses: list[int] = []
        retry_after: list[float] = []

        def seen(response: httpx.Response) -> None:
            statuses.append(response.status_code)
            if "retry-after" in response.headers:
                retry_after.append(float(response.headers["retry-after"]))
            stop.set()  # refused once: let the slot free up for the retry

        def sleep(seconds: float) -> None:
            waits.append(seconds)
            time.sleep(seconds)

        http = httpx.Client(base_url=busy_server.url, event_hooks={"response": [seen]}, timeout=30)
        with http, AttentionClient(http=http, retry=RetryPolicy(max_retries=10)) as c:
            c._sleep = sleep  # type: ignore[method-assign]
            r = c.softmax(ROW2, precision="float64")
    np.testing.assert_allclose(r.probabilities, [0.2704, 0.0546, 0.0100, 0.6650], atol=1e-4)
    assert statuses[0] == 503 and statuses[-1] == 200 and set(statuses) == {503, 200}, statuses
    # the server's Retry-After (its expected wait, at least 1 s), honoured as sent
    assert len(waits) == len(statuses) - 1 and waits == retry_after and all(w >= 1.0 for w in waits)


def test_503_without_retries_is_overloaded_error(busy_server: LiveServer) -> None:
    with (
        _saturated(busy_server),
        AttentionClient(busy_server.url, retry=RetryPolicy(max_retries=0)) as c,
        pytest.raises(OverloadedError) as info,
    ):
        c.softmax([1.0])
    # Retry-After: the expected wait for a slot held 1.5 s at a time, at least 1 s
    assert info.value.status == 503 and info.value.retry_after is not None and info.value.retry_after >= 1.0
    assert info.value.detail


def test_async_client_under_concurrency(keyed_server: LiveServer) -> None:
    rng = np.random.default_rng(7)
    inputs = [rng.standard_normal((2, 5, 8)) for _ in range(24)]

    async def main() -> list[Any]:
        async with AsyncAttentionClient(keyed_server.url, api_key=API_KEY) as c:
            assert await c.ready()
            tasks = [
                c.attention(x, x, x, causal=True, precision="float64", request_id=f"a-{i:04d}")
                for i, x in enumerate(inputs)
            ]
            got = await asyncio.gather(*tasks)
            with pytest.raises(ValidationError):
                await c.softmax([1.0], axis=3)
            return got

    results = asyncio.run(main())
    for i, (x, r) in enumerate(zip(inputs, results, strict=True)):
        ref = attention(x, x, x, params=AttentionParams(causal="top_left"), dtype=np.float64)
        np.testing.assert_allclose(r.output, ref.output, atol=1e-12)
        assert r.request_id == f"a-{i:04d}"


def test_async_client_retries_503(busy_server: LiveServer) -> None:
    async def main() -> list[Any]:
        async with AsyncAttentionClient(busy_server.url, retry=RetryPolicy(max_retries=10)) as c:
            return await asyncio.gather(*(c.softmax([0.0, float(i)], precision="float64") for i in range(2)))

    results = asyncio.run(main())  # one slot, no queue: one of the two was refused and retried
    for i, r in enumerate(results):
        np.testing.assert_allclose(r.probabilities, np.exp([0.0, i]) / np.exp([0.0, i]).sum(), atol=1e-12)


def test_attention_backward_matches_finite_differences(client: AttentionClient) -> None:
    rng = np.random.default_rng(3)
    q, k, v, g = (
        rng.standard_normal((3, 4)),
        rng.standard_normal((5, 4)),
        rng.standard_normal((5, 2)),
        rng.standard_normal((3, 2)),
    )
    r = client.attention_backward(
        q,
        k,
        v,
        g,
        normalizer="entmax15",
        precision="float64",
        returns=["grad_query", "grad_value", "weights", "grad_scale"],
    )
    assert r.grad_query is not None and r.grad_value is not None and r.weights is not None and r.grad_key is None
    np.testing.assert_allclose(r.grad_value, r.weights.T @ g, atol=1e-12)  # dV = A^T dO

    def loss(query: np.ndarray) -> float:
        out = client.attention(query, k, v, normalizer="entmax15", precision="float64", returns=["output"]).output
        assert out is not None
        return float((out * g).sum())

    eps, i, j = 1e-6, 1, 2
    bump = np.zeros_like(q)
    bump[i, j] = eps
    numeric = (loss(q + bump) - loss(q - bump)) / (2 * eps)
    assert abs(r.grad_query[i, j] - numeric) < 1e-6
    assert isinstance(r.grad_scale, float) and r.engine is not None and r.request_id


def test_analyze_sweep(client: AttentionClient) -> None:
    r = client.analyze(shape=[1, 2, 16, 64], seed=0, scales=[0.125, 1.0], temperatures=[1.0])
    assert [(row.scale, row.temperature, row.head_dim) for row in r.sweep] == [(0.125, 1.0, 64), (1.0, 1.0, 64)]
    small, large = r.sweep
    # a larger scale sharpens the softmax: lower entropy, a smaller Jacobian (the gradient starts to vanish)
    assert large.mean_entropy is not None and small.mean_entropy is not None and large.mean_entropy < small.mean_entropy
    assert large.mean_jacobian_norm is not None and small.mean_jacobian_norm is not None
    assert large.mean_jacobian_norm < small.mean_jacobian_norm
    same = client.analyze(shape=[1, 2, 16, 64], seed=0, scales=[0.125, 1.0], temperatures=[1.0])
    assert [row.raw for row in same.sweep] == [row.raw for row in r.sweep]  # seeded draw
    assert r.request_id and r.timing_ms["total"] > 0


def test_sample_final_distributions_from_the_spec(client: AttentionClient) -> None:
    row = [2.1, 0.5, -1.2, 3.0]
    wanted = ["tokens", "logprobs", "probabilities", "diagnostics", "top_logprobs"]
    r = client.sample(row, top_k=2, seed=7, n=5, top_logprobs=2, returns=wanted)  # docs/concepts/contract.md: top_k 2
    assert r.probabilities is not None and r.tokens is not None and r.logprobs is not None
    np.testing.assert_allclose(r.probabilities, [0.2891, 0, 0, 0.7109], atol=1e-4)
    assert r.tokens.shape == (5,) and set(r.tokens.tolist()) <= {0, 3} and r.seed == 7
    np.testing.assert_allclose(r.logprobs, np.log(r.probabilities[r.tokens]), atol=1e-5)
    assert [(t.token, round(t.logprob, 4)) for t in r.top_logprobs] == [(3, -0.3412), (0, -1.2412)]  # rank-1 logits
    again = client.sample(row, top_k=2, seed=7, n=5)
    assert again.tokens is not None and again.tokens.tolist() == r.tokens.tolist()  # same seed, same tokens
    t2 = client.sample(row, temperature=2.0, top_p=0.9, returns=["probabilities"])
    assert t2.probabilities is not None
    np.testing.assert_allclose(t2.probabilities, [0.3314, 0.1489, 0, 0.5197], atol=1e-4)
    pen = client.sample(
        row,
        repetition_penalty=1.5,
        frequency_penalty=0.1,
        presence_penalty=0.2,
        previous_tokens=[0, 2, 2],
        returns=["probabilities"],
    )
    assert pen.probabilities is not None
    np.testing.assert_allclose(pen.probabilities, [0.1209, 0.0663, 0.0045, 0.8083], atol=1e-4)


def test_calibrate_lowers_the_calibration_error(client: AttentionClient) -> None:
    rng = np.random.default_rng(5)
    labels = rng.integers(0, 4, 300)
    logits = 3.0 * (np.eye(4)[labels] * 1.2 + rng.standard_normal((300, 4)))  # overconfident
    r = client.calibrate(logits, labels, bins=10)
    assert r.temperature > 1 and not r.bounded
    assert r.ece["after"] < r.ece["before"] and r.nll["after"] < r.nll["before"]
    assert len(r.reliability["before"]) == 10 and sum(b.count for b in r.reliability["after"]) == 300
    assert r.accuracy is not None and 0 < r.accuracy < 1 and r.request_id
