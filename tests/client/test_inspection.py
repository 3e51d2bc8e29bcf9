"""The per-head inspection in the client (issue 31): ``"inspection"`` and ``"norm_weights"`` on ``attention``,
``"head_importance"`` on ``attention_backward``.

Against a live server, the client's numbers equal those of a raw ``httpx`` POST of the same request (the JSON
form, not the client's base64); with scripted answers, the bodies carry the inspection's options only when they
differ from the service's defaults, and the answers parse into the typed fields.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
from attention_client import (
    AsyncAttentionClient,
    AttentionClient,
    AttentionResult,
    BackwardResult,
    HeadInspection,
    InspectionReport,
    ValidationError,
)
from attention_client._wire import loads

from tests.e2e.conftest import LiveServer
from tests.live import API_KEY

INSPECTION_FIELDS = ("sink_positions", "token_ids", "exclude_bos", "exclude_current_token")
SCORES = ("previous_token_score", "duplicate_token_score", "induction_score")


def _draw(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Grouped-query attention: B=2, H=4 query heads over Hkv=2, L=S=6."""
    rng = np.random.default_rng(seed)
    return rng.standard_normal((2, 4, 6, 8)), rng.standard_normal((2, 2, 6, 8)), rng.standard_normal((2, 2, 6, 3))


TOKENS = [[1, 2, 3, 1, 2, 3], [5, 5, 7, 9, 5, 7]]


# ------------------------------------------------------------------ against a live server


@pytest.fixture
def client(keyed_server: LiveServer) -> Iterator[AttentionClient]:
    with AttentionClient(keyed_server.url, api_key=API_KEY) as c:
        yield c


def _raw(server: LiveServer, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """The answer to ``body`` sent as plain JSON (lists of numbers, the JSON answer form)."""
    with httpx.Client(base_url=server.url, headers={"authorization": f"Bearer {API_KEY}"}, timeout=30) as http:
        response = http.post(path, json=body)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


@pytest.mark.slow
@pytest.mark.parametrize(
    "options",
    [
        {"token_ids": TOKENS},
        {"token_ids": TOKENS, "sink_positions": 2, "exclude_bos": True, "exclude_current_token": True},
        {"sink_positions": 0},
        {},
    ],
    ids=["token_ids", "every_option", "no_sinks", "defaults"],
)
def test_inspection_and_norm_weights_equal_a_raw_request(
    client: AttentionClient, keyed_server: LiveServer, options: dict[str, Any]
) -> None:
    q, k, v = _draw()
    r = client.attention(
        q, k, v, causal=True, precision="float64", returns=["weights", "inspection", "norm_weights"], **options
    )
    raw = _raw(
        keyed_server,
        "/v1/attention",
        {
            "query": q.tolist(),
            "key": k.tolist(),
            "value": v.tolist(),
            "causal": True,
            "precision": "float64",
            "return": ["inspection", "norm_weights"],
            **options,
        },
    )
    assert isinstance(r, AttentionResult) and r.inspection is not None and r.norm_weights is not None
    assert r.inspection == raw["inspection"]  # the same numbers, to the last bit (JSON floats round-trip)
    assert r.inspection["sink_positions"] == options.get("sink_positions", 4)
    heads = r.inspection["heads"]
    assert [(h["batch"], h["head"]) for h in heads] == [(b, h) for b in range(2) for h in range(4)]
    for head in heads:
        assert all((name in head) == ("token_ids" in options) for name in SCORES)
    assert r.norm_weights.dtype == np.float64 and r.norm_weights.shape == (2, 4, 6, 6)
    np.testing.assert_array_equal(r.norm_weights, np.asarray(raw["norm_weights"]))
    # N_ij = A_ij ||v_j|| (Kobayashi et al.), each query head reading its key-value head
    assert r.weights is not None
    value_norms = np.repeat(np.linalg.norm(v, axis=-1), 2, axis=1)[:, :, None, :]
    np.testing.assert_allclose(r.norm_weights, r.weights * value_norms, rtol=1e-12, atol=1e-15)


@pytest.mark.slow
def test_a_default_call_sends_no_inspection_options_and_gets_none(client: AttentionClient) -> None:
    q, k, v = _draw(1)
    r = client.attention(q, k, v)
    assert r.inspection is None and r.norm_weights is None
    assert not {"inspection", "norm_weights"} & r.raw.keys()


@pytest.mark.slow
def test_head_importance_equals_a_raw_request_and_the_formula(
    client: AttentionClient, keyed_server: LiveServer
) -> None:
    q, k, v = _draw(2)
    g = np.random.default_rng(3).standard_normal((2, 4, 6, 3))
    r = client.attention_backward(
        q, k, v, g, causal="bottom_right", precision="float64", returns=["head_importance", "output"]
    )
    raw = _raw(
        keyed_server,
        "/v1/attention/backward",
        {
            "query": q.tolist(),
            "key": k.tolist(),
            "value": v.tolist(),
            "grad_output": g.tolist(),
            "causal": "bottom_right",
            "precision": "float64",
            "return": ["head_importance"],
        },
    )
    assert isinstance(r, BackwardResult) and r.head_importance is not None and r.output is not None
    assert r.head_importance.shape == (2, 4) and r.head_importance.dtype == np.float64
    np.testing.assert_array_equal(r.head_importance, np.asarray(raw["head_importance"]))
    np.testing.assert_allclose(r.head_importance, np.abs((g * r.output).sum(axis=(2, 3))), rtol=1e-12)
    assert r.grad_query is None


@pytest.mark.slow
def test_token_ids_that_do_not_match_the_keys_are_the_servers_422(client: AttentionClient) -> None:
    q, k, v = _draw()
    with pytest.raises(ValidationError) as info:
        client.attention(q, k, v, returns=["inspection"], token_ids=[[1, 2, 3], [4, 5, 6]])
    assert info.value.status == 422 and [e["loc"] for e in info.value.errors] == [["token_ids"]]


# ------------------------------------------------------------------ scripted answers


def _b64(a: np.ndarray) -> dict[str, Any]:
    return {"shape": list(a.shape), "dtype": str(a.dtype), "b64": base64.b64encode(a.astype("<f8").tobytes()).decode()}


HEAD: HeadInspection = {
    "batch": 0,
    "head": 0,
    "sink_mass": 0.75,
    "spectral_norm": 3.5,
    "live_rows": 2,
    "norm_max_share": 0.5,
    "norm_argmax_agreement": 1.0,
    "previous_token_score": 0.25,
    "duplicate_token_score": 0.0,
    "induction_score": 0.125,
}
REPORT: InspectionReport = {"sink_positions": 4, "heads": [HEAD]}
NORMS = np.array([[[[0.5, 0.25], [0.0, 1.5]]]])
IMPORTANCE = np.array([[0.5, 2.25]])
ENGINE = {"name": "numpy", "provider": "CPU/numpy", "reason": "asked"}


def _scripted(answer: dict[str, Any]) -> tuple[AttentionClient, list[dict[str, Any]]]:
    bodies: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(loads(request.content))
        return httpx.Response(200, json=answer)

    return AttentionClient("http://test", transport=httpx.MockTransport(handler)), bodies


ONE = [[[[1.0, 0.0], [0.0, 1.0]]]]


def test_the_options_are_sent_when_they_differ_from_the_defaults() -> None:
    c, bodies = _scripted({"inspection": REPORT, "norm_weights": _b64(NORMS), "engine": ENGINE})
    r = c.attention(
        ONE,
        ONE,
        ONE,
        returns=["inspection", "norm_weights"],
        sink_positions=1,
        token_ids=np.array([[7, 7]], dtype=np.uint16),
        exclude_bos=True,
        exclude_current_token=np.bool_(True),
    )
    body = bodies[0]
    assert body["return"] == ["inspection", "norm_weights"]
    assert body["sink_positions"] == 1 and body["token_ids"] == [[7, 7]]
    assert body["exclude_bos"] is True and body["exclude_current_token"] is True
    assert r.inspection == REPORT and r.inspection["heads"][0]["induction_score"] == 0.125
    assert r.norm_weights is not None and np.array_equal(r.norm_weights, NORMS)
    c.attention(ONE, ONE, ONE, returns=["inspection"], token_ids=[[3.0, 4.0]])  # integral floats are integers
    assert bodies[1]["token_ids"] == [[3, 4]] and all(isinstance(t, int) for t in bodies[1]["token_ids"][0])


def test_default_options_are_not_sent() -> None:
    """A server without the inspection refuses unknown fields: a call that does not use them must not send them."""
    c, bodies = _scripted({"output": ONE, "weights": ONE, "diagnostics": {"heads": []}, "engine": ENGINE})
    c.attention(ONE, ONE, ONE)
    c.attention(ONE, ONE, ONE, returns=["inspection"], sink_positions=4, exclude_bos=False, exclude_current_token=False)
    assert not set(INSPECTION_FIELDS) & bodies[0].keys() and not set(INSPECTION_FIELDS) & bodies[1].keys()
    c.attention(ONE, ONE, ONE, returns=["inspection"], sink_positions=0)
    assert bodies[2]["sink_positions"] == 0


def test_head_importance_parses_and_the_backward_body_has_no_inspection_options() -> None:
    c, bodies = _scripted({"head_importance": _b64(IMPORTANCE), "engine": ENGINE})
    r = c.attention_backward(ONE, ONE, ONE, ONE, returns=["head_importance"])
    assert r.head_importance is not None and np.array_equal(r.head_importance, IMPORTANCE)
    assert r.grad_query is None and bodies[0]["return"] == ["head_importance"]
    assert not set(INSPECTION_FIELDS) & bodies[0].keys()
    none, _ = _scripted({"grad_query": ONE, "grad_key": ONE, "grad_value": ONE, "engine": ENGINE})
    assert none.attention_backward(ONE, ONE, ONE, ONE).head_importance is None


def test_the_async_client_sends_the_same_body() -> None:
    sync, sync_bodies = _scripted({"inspection": REPORT, "engine": ENGINE})
    options: dict[str, Any] = {"sink_positions": 2, "token_ids": [[1, 2]], "exclude_bos": True}
    sync.attention(ONE, ONE, ONE, returns=["inspection"], **options)
    async_bodies: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        async_bodies.append(loads(request.content))
        return httpx.Response(200, json={"inspection": REPORT, "engine": ENGINE})

    async def main() -> AttentionResult:
        async with AsyncAttentionClient("http://test", transport=httpx.MockTransport(handler)) as c:
            return await c.attention(ONE, ONE, ONE, returns=["inspection"], **options)

    r = asyncio.run(main())
    assert async_bodies == sync_bodies and r.inspection == REPORT
