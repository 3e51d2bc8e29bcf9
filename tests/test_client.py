"""The Python client against the app: base64 both ways, numbers equal to the core, errors raised."""

from __future__ import annotations

import numpy as np
import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.client import AttentionClient, ServiceError, decode_tensor, encode_tensor
from service.core.attention import attention
from service.core.types import AttentionParams
from service.settings import Settings


@pytest.fixture(scope="module")
def client():
    with TestClient(create_app(Settings(enable_onnx=False))) as http:
        yield AttentionClient(http=http)


def test_tensor_round_trip() -> None:
    for a in (np.arange(6, dtype=np.float32).reshape(2, 3), np.array([[True, False]]), np.ones((1, 2), np.float64)):
        back = decode_tensor(encode_tensor(a))
        assert back.dtype == a.dtype and back.shape == a.shape and np.array_equal(back, a)


def test_attention_matches_the_core(client: AttentionClient) -> None:
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((1, 4, 6, 8)), rng.standard_normal((1, 2, 7, 8)), rng.standard_normal((1, 2, 7, 3))
    reply = client.attention(q, k, v, causal="bottom_right", normalizer="entmax15", precision="float64")
    ref = attention(q, k, v, params=AttentionParams(normalizer="entmax15", causal="bottom_right"), dtype=np.float64)
    assert reply.output.dtype == np.float64
    np.testing.assert_allclose(reply.output, ref.output, atol=1e-12)
    np.testing.assert_allclose(reply.weights, ref.weights, atol=1e-12)
    assert reply.engine["name"] == "numpy" and len(reply.diagnostics["heads"]) == 4


def test_softmax_and_errors(client: AttentionClient) -> None:
    got = client.softmax(np.array([[2.1, 0.5, -1.2, 3.0]]), log=True, precision="float64")
    np.testing.assert_allclose(got["log_probabilities"], [[-1.3079, -2.9079, -4.6079, -0.4079]], atol=1e-4)
    with pytest.raises(ServiceError) as info:
        client.attention(np.ones((2, 4)), np.ones((2, 3)), np.ones((2, 3)))
    assert info.value.status == 422 and "E=3" in info.value.problem["detail"]
    assert client.ready()
