"""The client's wire form, error mapping and retry policy, against scripted answers (httpx.MockTransport)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import httpx
import numpy as np
import pytest
from attention_client import (
    AsyncAttentionClient,
    AttentionClient,
    OverloadedError,
    RetryPolicy,
    ServerTimeoutError,
    ServiceError,
    TransportError,
    ValidationError,
    decode_tensor,
    encode_tensor,
)
from attention_client.retry import parse_retry_after

from service.http.codecs.tensors import decode_tensor as server_decode
from service.http.codecs.tensors import encode_tensor as server_encode


def test_tensor_round_trip_through_the_server_codec() -> None:
    arrays = [
        np.arange(6, dtype=np.float32).reshape(2, 3),
        np.array([[True, False]]),
        np.linspace(-1, 1, 8).reshape(2, 2, 2),
        np.ones((1, 2), np.float16),
    ]
    for a in arrays:
        back = decode_tensor(encode_tensor(a))
        assert back.dtype == a.dtype and back.shape == a.shape and np.array_equal(back, a)
        on_server = server_decode(encode_tensor(a), "x", kind="mask")
        assert np.array_equal(on_server, a)
        from_server = decode_tensor(server_encode(on_server, "base64"))
        assert from_server.dtype == a.dtype and np.array_equal(from_server, a)


def test_integers_go_as_float64_and_big_endian_is_swapped() -> None:
    assert encode_tensor(np.arange(3))["dtype"] == "float64"
    big = np.arange(4, dtype=">f4")
    assert np.array_equal(decode_tensor(encode_tensor(big)), big)
    assert encode_tensor(big)["b64"] == encode_tensor(big.astype("<f4"))["b64"]


def test_json_lists_decode_with_null_as_masked() -> None:
    got = decode_tensor([[0.5, None], [1.0, 2.0]])
    assert got.dtype == np.float64 and np.isneginf(got[0, 1]) and got[1, 1] == 2.0


Handler = Callable[[httpx.Request], httpx.Response]


def _client(handler: Handler, **kwargs: Any) -> tuple[AttentionClient, list[float]]:
    slept: list[float] = []
    c = AttentionClient("http://test", transport=httpx.MockTransport(handler), **kwargs)
    c._sleep = slept.append  # type: ignore[method-assign]
    return c, slept


def _script(*responses: httpx.Response | Exception) -> tuple[Handler, list[httpx.Request]]:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        item = responses[min(len(seen), len(responses)) - 1]
        if isinstance(item, Exception):
            raise item
        return item

    return handler, seen


SOFTMAX_OK = httpx.Response(
    200,
    json={"probabilities": [0.5, 0.5], "diagnostics": {"entropy": 0.6931, "max": 0.5, "argmax": 0}, "timing_ms": {}},
    headers={"x-request-id": "r1"},
)


def test_non_json_error_bodies_are_service_errors() -> None:
    handler, _ = _script(
        httpx.Response(502, text="<html><h1>Bad Gateway</h1></html>", headers={"content-type": "text/html"})
    )
    c, _ = _client(handler)
    with pytest.raises(ServiceError) as info:
        c.softmax([1.0])
    assert type(info.value) is ServiceError and info.value.status == 502
    assert info.value.title == "Bad Gateway" and "<h1>Bad Gateway</h1>" in info.value.detail
    handler, _ = _script(
        httpx.Response(500, content=b"{not json", headers={"content-type": "application/problem+json"})
    )
    with pytest.raises(ServiceError) as info:
        _client(handler)[0].softmax([1.0])
    assert info.value.status == 500 and info.value.detail == "{not json"
    handler, _ = _script(httpx.Response(504, content=b""))
    with pytest.raises(ServerTimeoutError) as info2:
        _client(handler)[0].softmax([1.0])
    assert info2.value.detail == "empty body"


def test_a_2xx_that_is_not_json_is_an_error() -> None:
    handler, _ = _script(httpx.Response(200, text="hello"))
    with pytest.raises(ServiceError) as info:
        _client(handler)[0].softmax([1.0])
    assert info.value.status == 200 and info.value.detail == "hello"


def test_v2_style_error_body_gives_detail() -> None:
    handler, _ = _script(httpx.Response(400, json={"error": "input 'query' is missing"}))
    with pytest.raises(ValidationError) as info:
        _client(handler)[0].softmax([1.0])
    assert info.value.detail == "input 'query' is missing"


def test_retry_after_seconds_is_honoured() -> None:
    busy = httpx.Response(
        503,
        json={"type": "about:blank", "title": "Service Unavailable", "status": 503, "detail": "busy"},
        headers={"retry-after": "2"},
    )
    handler, seen = _script(busy, busy, SOFTMAX_OK)
    c, slept = _client(handler)
    r = c.softmax([1.0, 1.0])
    assert slept == [2.0, 2.0] and len(seen) == 3 and r.request_id == "r1"
    assert r.probabilities.tolist() == [0.5, 0.5]


def test_429_without_retry_after_backs_off_exponentially() -> None:
    handler, seen = _script(httpx.Response(429, json={"detail": "slow down"}))
    c, slept = _client(handler, retry=RetryPolicy(max_retries=4, backoff_s=0.1, max_backoff_s=0.3))
    with pytest.raises(OverloadedError) as info:
        c.softmax([1.0])
    assert len(seen) == 5 and info.value.status == 429 and info.value.detail == "slow down"
    caps = [0.1, 0.2, 0.3, 0.3]
    assert len(slept) == 4 and all(0 <= s <= cap for s, cap in zip(slept, caps, strict=True))


def test_a_retry_after_longer_than_the_bound_is_raised_at_once() -> None:
    handler, seen = _script(httpx.Response(503, json={"detail": "starting"}, headers={"retry-after": "120"}))
    c, slept = _client(handler, retry=RetryPolicy(max_retry_after_s=30))
    with pytest.raises(OverloadedError) as info:
        c.softmax([1.0])
    assert len(seen) == 1 and slept == [] and info.value.retry_after == 120.0


def test_other_errors_are_not_retried() -> None:
    for status in (400, 401, 413, 422, 500, 504):
        handler, seen = _script(httpx.Response(status, json={"detail": "no"}))
        with pytest.raises(ServiceError) as info:
            _client(handler)[0].softmax([1.0])
        assert len(seen) == 1 and info.value.status == status


def test_connection_errors_are_retried_timeouts_are_not() -> None:
    handler, seen = _script(httpx.ConnectError("refused"), httpx.RemoteProtocolError("closed"), SOFTMAX_OK)
    c, slept = _client(handler)
    assert c.softmax([1.0, 1.0]).request_id == "r1" and len(seen) == 3 and len(slept) == 2
    handler, seen = _script(httpx.ReadTimeout("slow"))
    with pytest.raises(TransportError) as info:
        _client(handler)[0].softmax([1.0])
    assert len(seen) == 1 and info.value.timed_out and info.value.status is None
    handler, seen = _script(httpx.ConnectError("refused"))
    with pytest.raises(TransportError):
        _client(handler, retry=RetryPolicy(retry_connection_errors=False))[0].softmax([1.0])
    assert len(seen) == 1


def test_parse_retry_after() -> None:
    now = datetime(2026, 11, 23, 15, 0, 0, tzinfo=UTC)
    assert parse_retry_after("7") == 7.0
    assert parse_retry_after("Mon, 23 Nov 2026 15:00:05 GMT", now=now) == 5.0
    assert parse_retry_after("Mon, 23 Nov 2026 14:00:00 GMT", now=now) == 0.0
    assert parse_retry_after("soon") is None and parse_retry_after(None) is None


def test_headers_on_the_wire() -> None:
    handler, seen = _script(SOFTMAX_OK)
    c, _ = _client(handler, api_key="k" * 20)
    c.softmax([1.0, 1.0], request_id="abc")
    h = seen[0].headers
    assert h["accept-encoding"] == "identity" and h["authorization"] == "Bearer " + "k" * 20
    assert h["x-request-id"] == "abc" and h["content-type"] == "application/json"
    handler, seen = _script(SOFTMAX_OK)
    _client(handler, compression=True)[0].softmax([1.0, 1.0])
    assert seen[0].headers["accept-encoding"] == "gzip" and "authorization" not in seen[0].headers


def test_async_client_retries_and_maps_errors() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:  # fresh answers: an async client needs async streams
        seen.append(request)
        if len(seen) == 1:
            return httpx.Response(503, json={"detail": "busy"}, headers={"retry-after": "0"})
        return httpx.Response(200, json={"probabilities": [0.5, 0.5]}, headers={"x-request-id": "r1"})

    def bad(request: httpx.Request) -> httpx.Response:
        return httpx.Response(422, json={"detail": "bad", "errors": [{"loc": ["logits"], "msg": "bad"}]})

    async def main() -> None:
        async with AsyncAttentionClient("http://test", transport=httpx.MockTransport(handler)) as c:
            r = await c.softmax([1.0, 1.0])
            assert r.request_id == "r1" and r.probabilities.tolist() == [0.5, 0.5]
        async with AsyncAttentionClient("http://test", transport=httpx.MockTransport(bad)) as c:
            with pytest.raises(ValidationError) as info:
                await c.softmax([1.0])
            assert info.value.errors == [{"loc": ["logits"], "msg": "bad"}]

    asyncio.run(main())
    assert len(seen) == 2
