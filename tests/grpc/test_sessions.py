"""Attention sessions over gRPC with tritonclient, unchanged: ``sequence_id`` (integer and string) on ``ModelInfer``
and on a ``ModelStreamInfer`` stream, each step equal to the stateless request over the whole prefix; ownership
by API key; the stream's end ending its sequences when asked (``ATTN_SESSION_END_WITH_STREAM``).
"""

from __future__ import annotations

import queue
from collections.abc import Callable
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as tg
from tritonclient.utils import InferenceServerException

from tests.grpc.conftest import API_KEY, GrpcServer

RNG = np.random.default_rng(30)


def inputs(**arrays: np.ndarray) -> list[tg.InferInput]:
    out = []
    for name, arr in arrays.items():
        tensor = tg.InferInput(name, list(arr.shape), "FP32")
        tensor.set_data_from_numpy(arr)
        out.append(tensor)
    return out


def token(positions: int = 1) -> dict[str, np.ndarray]:
    return {
        "query": RNG.standard_normal((1, 4, positions, 8), dtype=np.float32),
        "key": RNG.standard_normal((1, 2, positions, 8), dtype=np.float32),
        "value": RNG.standard_normal((1, 2, positions, 8), dtype=np.float32),
    }


def stateless(client: tg.InferenceServerClient, q: np.ndarray, keys: np.ndarray, values: np.ndarray) -> np.ndarray:
    result = client.infer("attention", inputs(query=q, key=keys, value=values), parameters={"causal": "bottom_right"})
    return result.as_numpy("output")


@pytest.mark.parametrize("sequence_id", [17, "conversation-17"])
def test_unary_steps_equal_the_stateless_request(server: GrpcServer, sequence_id: int | str) -> None:
    client = tg.InferenceServerClient(server.target)
    keys, values = np.zeros((1, 2, 0, 8), np.float32), np.zeros((1, 2, 0, 8), np.float32)
    for step in range(5):
        arrays = token(5 if step == 0 else 1)
        keys, values = np.concatenate([keys, arrays["key"]], 2), np.concatenate([values, arrays["value"]], 2)
        result = client.infer(
            "attention_session", inputs(**arrays), sequence_id=sequence_id, sequence_start=step == 0,
            sequence_end=step == 4,
        )  # fmt: skip
        np.testing.assert_array_equal(result.as_numpy("output"), stateless(client, arrays["query"], keys, values))
        assert result.as_numpy("positions_seen").tolist() == [keys.shape[2]]
    with pytest.raises(InferenceServerException, match="has ended"):
        client.infer("attention_session", inputs(**token()), sequence_id=sequence_id)


def test_a_stream_carries_a_sequence_in_order(server: GrpcServer) -> None:
    client = tg.InferenceServerClient(server.target)
    answers: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put(error or result))
    sent = [token(3)] + [token() for _ in range(5)]
    try:
        for i, arrays in enumerate(sent):  # all sent before any answer is read: the stream keeps their order
            client.async_stream_infer(
                "attention_session", inputs(**arrays), request_id=str(i), sequence_id=99, sequence_start=i == 0
            )
        results = [answers.get(timeout=30) for _ in sent]
    finally:
        client.stop_stream()
    keys, values = np.zeros((1, 2, 0, 8), np.float32), np.zeros((1, 2, 0, 8), np.float32)
    for i, (arrays, result) in enumerate(zip(sent, results, strict=True)):
        assert not isinstance(result, Exception), result
        assert result.get_response().id == str(i)
        keys, values = np.concatenate([keys, arrays["key"]], 2), np.concatenate([values, arrays["value"]], 2)
        np.testing.assert_array_equal(result.as_numpy("output"), stateless(client, arrays["query"], keys, values))
    # by default a sequence outlives its stream (Triton's behaviour)
    assert client.infer("attention_session", inputs(**token()), sequence_id=99).as_numpy("cache_length")[0] == 9
    client.close()


def test_a_sequence_belongs_to_the_key_that_started_it(server_with: Callable[..., GrpcServer]) -> None:
    other = "another-grpc-key-0123456789"
    server = server_with(ATTN_API_KEYS=f"{API_KEY},{other}")
    client = tg.InferenceServerClient(server.target)
    mine, theirs = {"authorization": f"Bearer {API_KEY}"}, {"x-api-key": other}
    client.infer("attention_session", inputs(**token()), sequence_id=5, sequence_start=True, headers=mine)
    with pytest.raises(InferenceServerException, match="never started"):
        client.infer("attention_session", inputs(**token()), sequence_id=5, headers=theirs)
    second = client.infer("attention_session", inputs(**token()), sequence_id=5, headers=mine)
    assert second.as_numpy("cache_length").tolist() == [2]


def test_with_the_option_a_closed_stream_ends_its_sequences(server_with: Callable[..., GrpcServer]) -> None:
    server = server_with(ATTN_SESSION_END_WITH_STREAM="true")
    client = tg.InferenceServerClient(server.target)
    answers: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put(error or result))
    client.async_stream_infer("attention_session", inputs(**token()), sequence_id="streamed", sequence_start=True)
    assert not isinstance(answers.get(timeout=30), Exception)
    client.stop_stream()
    with pytest.raises(InferenceServerException, match="when the gRPC stream that carried it closed"):
        client.infer("attention_session", inputs(**token()), sequence_id="streamed")
    assert 'attn_session_evictions_total{reason="stream_closed"} 1.0' in httpx.get(f"{server.url}/metrics").text
    client.close()


def test_server_metadata_lists_the_sequence_extension(server: GrpcServer) -> None:
    extensions = tg.InferenceServerClient(server.target).get_server_metadata().extensions
    assert "sequence" in extensions and "sequence(string_id)" in extensions
