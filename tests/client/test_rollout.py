"""Attention rollout in the client (issue 31 item 3): ``rollout()`` on both clients, ``POST /v1/attention/rollout``.

Against a live server, the client's numbers equal those of a raw ``httpx`` POST of the same request (the JSON form,
not the client's base64) and those of ``service.core.rollout`` computed here for the same stack and options; the
server's refusals come back as :class:`ValidationError` naming the place. With scripted answers: the body on the
wire, the answer parsed, and the input the client refuses before sending anything.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import numpy as np
import pytest
from attention_client import (
    AsyncAttentionClient,
    AttentionClient,
    RolloutResult,
    ServiceError,
    ValidationError,
)
from attention_client._wire import loads

from service.core.rollout import RolloutParams, resolve_rows, row_sum_tolerance
from service.core.rollout import rollout as core_rollout
from tests.e2e.conftest import LiveServer
from tests.live import API_KEY

LAYERS, B, H, L = 3, 2, 4, 6


def _stack(seed: int = 0, dtype: type[np.floating[Any]] = np.float64) -> np.ndarray:
    """Causal softmax weights ``[layers, B, H, L, L]``: each row sums to 1 over its keys 0..i."""
    rng = np.random.default_rng(seed)
    scores = rng.standard_normal((LAYERS, B, H, L, L))
    scores[..., np.triu(np.ones((L, L), bool), 1)] = -np.inf
    w = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return (w / w.sum(axis=-1, keepdims=True)).astype(dtype)


def _gradients(seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((LAYERS, B, H, L, L))


def _expected(weights: np.ndarray, gradients: np.ndarray | None, options: dict[str, Any], precision: str) -> np.ndarray:
    """``service.core.rollout`` of the stack, as the service computes it (float64), for these options."""
    params = RolloutParams(
        head_fusion=options.get("head_fusion", "mean"),
        residual=options.get("residual", 0.5),
        discard_ratio=options.get("discard_ratio", 0.0),
        renormalize=options.get("renormalize", False),
        tolerance=row_sum_tolerance(weights.dtype, np.dtype(precision)),
    )
    rows = options.get("rows")
    picked = None if rows is None else resolve_rows(rows, weights.shape[-1])
    return core_rollout(weights, gradients, params, picked)


# ------------------------------------------------------------------ against a live server


@pytest.fixture
def client(keyed_server: LiveServer) -> Iterator[AttentionClient]:
    with AttentionClient(keyed_server.url, api_key=API_KEY) as c:
        yield c


def _raw(server: LiveServer, body: dict[str, Any]) -> dict[str, Any]:
    """The answer to ``body`` sent as plain JSON (lists of numbers, the JSON answer form)."""
    with httpx.Client(base_url=server.url, headers={"authorization": f"Bearer {API_KEY}"}, timeout=30) as http:
        response = http.post("/v1/attention/rollout", json=body)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


CASES: list[tuple[str, dict[str, Any], bool]] = [
    ("defaults", {}, False),
    ("max_residual_discard", {"head_fusion": "max", "residual": 0.3, "discard_ratio": 0.25}, False),
    ("min_rows", {"head_fusion": "min", "rows": [-1, 0]}, False),
    ("gradients", {"discard_ratio": 0.1}, True),
    ("gradients_rows", {"rows": [2], "residual": 0.9}, True),
    ("no_residual", {"residual": 0.0}, False),
]


@pytest.mark.slow
@pytest.mark.parametrize(("options", "with_gradients"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_rollout_equals_a_raw_request_and_the_core(
    client: AttentionClient, keyed_server: LiveServer, options: dict[str, Any], with_gradients: bool
) -> None:
    weights = _stack()
    gradients = _gradients() if with_gradients else None
    r = client.rollout(weights, gradients=gradients, precision="float64", **options)
    raw_body: dict[str, Any] = {"weights": weights.tolist(), "precision": "float64", **options}
    if gradients is not None:
        raw_body["gradients"] = gradients.tolist()
    raw = _raw(keyed_server, raw_body)
    assert isinstance(r, RolloutResult)
    rows = len(options["rows"]) if "rows" in options else L
    assert r.rollout.dtype == np.float64 and r.rollout.shape == (B, rows, L)
    np.testing.assert_array_equal(r.rollout, np.asarray(raw["rollout"]))  # JSON floats round-trip: to the last bit
    np.testing.assert_allclose(r.rollout, _expected(weights, gradients, options, "float64"), rtol=1e-13, atol=1e-15)
    if options.get("residual", 0.5) > 0:  # every row of the rollout is a distribution over the input tokens
        np.testing.assert_allclose(r.rollout.sum(axis=-1), 1.0, rtol=1e-12)
    assert r.timing_ms and "total" in r.timing_ms and set(r.raw) == {"rollout", "timing_ms"}


@pytest.mark.slow
def test_float32_weights_and_answer(client: AttentionClient, keyed_server: LiveServer) -> None:
    """float32 weights go as float32 (held to float32's row-sum tolerance) and the answer is float32: the core's
    float64 rollout rounded once.
    """
    weights = _stack(2, np.float32)
    r = client.rollout(weights, head_fusion="max", discard_ratio=0.2)
    raw = _raw(keyed_server, {"weights": weights.tolist(), "head_fusion": "max", "discard_ratio": 0.2})
    assert r.rollout.dtype == np.float32 and r.rollout.shape == (B, L, L)
    np.testing.assert_array_equal(r.rollout, np.asarray(raw["rollout"], dtype=np.float32))
    expected = _expected(weights, None, {"head_fusion": "max", "discard_ratio": 0.2}, "float32")
    np.testing.assert_array_equal(r.rollout, expected.astype(np.float32))


@pytest.mark.slow
def test_renormalize_divides_rows_the_server_would_refuse(client: AttentionClient) -> None:
    weights = _stack(3) * np.linspace(0.5, 2.0, L)[:, None]  # row i scaled: rows no longer sum to 1
    with pytest.raises(ValidationError) as info:
        client.rollout(weights, precision="float64")
    assert info.value.status == 422 and "renormalize" in str(info.value)
    assert info.value.errors[0]["loc"][:4] == ["weights", 0, 0, 0]  # the first row that does not sum to 1
    r = client.rollout(weights, renormalize=True, precision="float64", rows=[0, -1])
    expected = _expected(weights, None, {"renormalize": True, "rows": [0, -1]}, "float64")
    np.testing.assert_allclose(r.rollout, expected, rtol=1e-13, atol=1e-15)


@pytest.mark.slow
def test_a_negative_weight_is_the_servers_422_naming_its_place(client: AttentionClient) -> None:
    weights = _stack(4)
    weights[1, 0, 2, 3, 0] = -0.25
    with pytest.raises(ValidationError) as info:
        client.rollout(weights)
    error = info.value
    assert error.status == 422 and error.errors[0]["loc"] == ["weights", 1, 0, 2, 3, 0]
    assert "(layer 1, batch 0, head 2, row 3)" in str(error) and "negative" in str(error)
    with pytest.raises(ValidationError) as info:  # rows in the client's form, out of the server's range
        client.rollout(_stack(), rows=[0, L])
    assert info.value.status == 422 and info.value.errors[0]["loc"] == ["rows", 1]
    with pytest.raises(ValidationError) as info:  # gradients fuse by the mean only
        client.rollout(_stack(), gradients=_gradients(), head_fusion="max")
    assert info.value.status == 422 and "head_fusion" in str(info.value)


@pytest.mark.slow
def test_the_async_client_answers_the_same(client: AttentionClient, keyed_server: LiveServer) -> None:
    weights, gradients = _stack(5), _gradients(6)

    async def main() -> list[RolloutResult]:
        async with AsyncAttentionClient(keyed_server.url, api_key=API_KEY) as c:
            return list(
                await asyncio.gather(
                    c.rollout(weights, precision="float64"),
                    c.rollout(weights, gradients=gradients, rows=[-1], precision="float64"),
                )
            )

    whole, last = asyncio.run(main())
    np.testing.assert_array_equal(whole.rollout, client.rollout(weights, precision="float64").rollout)
    same = client.rollout(weights, gradients=gradients, rows=[-1], precision="float64")
    np.testing.assert_array_equal(last.rollout, same.rollout)


@pytest.mark.slow
def test_top_k_answers_each_rows_largest_entries(client: AttentionClient) -> None:
    weights = _stack(7)
    whole = client.rollout(weights, precision="float64").rollout
    assert whole is not None
    r = client.rollout(weights, rows=[-1, 2], top_k=3, precision="float64")
    assert r.rollout is None and r.top_keys is not None and r.top_values is not None
    assert r.top_keys.dtype == np.int64 and r.top_keys.shape == r.top_values.shape == (B, 2, 3)
    want = np.argsort(-whole[:, [-1, 2]], axis=-1, kind="stable")[..., :3]
    np.testing.assert_array_equal(r.top_keys, want)
    np.testing.assert_array_equal(r.top_values, np.take_along_axis(whole[:, [-1, 2]], want, axis=-1))
    with pytest.raises(ValidationError) as info:
        client.rollout(weights, top_k=L + 1)
    assert info.value.status == 422 and info.value.errors[0]["loc"] == ["top_k"]


# ------------------------------------------------------------------ scripted answers


def _b64(a: np.ndarray) -> dict[str, Any]:
    return {"shape": list(a.shape), "dtype": str(a.dtype), "b64": base64.b64encode(a.astype("<f8").tobytes()).decode()}


ANSWER = np.array([[[1.0, 0.0], [0.25, 0.75]]])
ONE_LAYER = [[[[[1.0, 0.0], [0.5, 0.5]]]]]  # [1, 1, 1, 2, 2]


def _scripted(
    answer: dict[str, Any] | None = None,
) -> tuple[AttentionClient, list[dict[str, Any]], list[httpx.Request]]:
    bodies: list[dict[str, Any]] = []
    requests: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        bodies.append(loads(request.content))
        body = answer if answer is not None else {"rollout": _b64(ANSWER), "timing_ms": {"total": 1.5}}
        return httpx.Response(200, json=body, headers={"x-request-id": request.headers.get("x-request-id", "r0")})

    return AttentionClient("http://test", transport=httpx.MockTransport(handler)), bodies, requests


def _decoded(wire: dict[str, Any]) -> np.ndarray:
    return np.frombuffer(base64.b64decode(wire["b64"]), dtype=np.dtype(wire["dtype"]).newbyteorder("<")).reshape(
        wire["shape"]
    )


def test_the_body_on_the_wire() -> None:
    c, bodies, requests = _scripted()
    weights = np.asarray(ONE_LAYER, dtype=np.float32)
    grads = np.full(weights.shape, -0.5, dtype=np.float16)
    r = c.rollout(
        weights,
        gradients=grads,
        residual=np.float32(0.25),
        discard_ratio=0,
        rows=np.array([-1, 0]),
        renormalize=np.bool_(True),
        precision="float64",
        request_id="abc",
    )
    body = bodies[0]
    assert requests[0].url.path == "/v1/attention/rollout" and requests[0].headers["x-request-id"] == "abc"
    assert set(body) == {
        "weights",
        "gradients",
        "head_fusion",
        "residual",
        "discard_ratio",
        "rows",
        "renormalize",
        "precision",
        "encoding",
    }
    assert body["weights"]["dtype"] == "float32" and body["weights"]["shape"] == [1, 1, 1, 2, 2]
    assert body["gradients"]["dtype"] == "float16"  # each keeps its dtype (the row-sum tolerance follows it)
    np.testing.assert_array_equal(_decoded(body["weights"]), weights)
    np.testing.assert_array_equal(_decoded(body["gradients"]), grads)
    assert body["rows"] == [-1, 0] and all(type(i) is int for i in body["rows"])
    assert body["head_fusion"] == "mean" and body["residual"] == 0.25 and body["discard_ratio"] == 0.0
    assert body["renormalize"] is True and body["precision"] == "float64" and body["encoding"] == "base64"
    np.testing.assert_array_equal(r.rollout, ANSWER)
    assert r.request_id == "abc" and r.timing_ms == {"total": 1.5} and "rollout" in r.raw
    c.rollout(ONE_LAYER, rows=(1,))  # nested lists: float64 on the wire; the defaults sent as they are
    second = bodies[1]
    assert second["weights"]["dtype"] == "float64" and "gradients" not in second and second["rows"] == [1]
    assert (second["head_fusion"], second["residual"], second["discard_ratio"]) == ("mean", 0.5, 0.0)
    assert second["renormalize"] is False and second["precision"] == "float32"
    c.rollout(ONE_LAYER)
    assert "rows" not in bodies[2] and "top_k" not in bodies[2]
    c.rollout(ONE_LAYER, top_k=np.int32(1))
    assert bodies[3]["top_k"] == 1 and type(bodies[3]["top_k"]) is int


def test_a_top_k_answer_is_parsed_without_rollout() -> None:
    keys, values = np.array([[[1], [0]]]), np.array([[[0.75], [1.0]]])
    answer = {"top_keys": _b64(keys), "top_values": _b64(values), "timing_ms": {"total": 1.0}}
    answer["top_keys"]["dtype"] = "int64"
    answer["top_keys"]["b64"] = base64.b64encode(keys.astype("<i8").tobytes()).decode()
    c, _, _ = _scripted(answer)
    r = c.rollout(ONE_LAYER, top_k=1)
    assert r.rollout is None and r.top_keys is not None and r.top_values is not None
    assert r.top_keys.dtype == np.int64
    np.testing.assert_array_equal(r.top_keys, keys)
    np.testing.assert_array_equal(r.top_values, values)


def test_an_answer_without_rollout_is_a_service_error() -> None:
    c, _, _ = _scripted({"timing_ms": {"total": 1.0}})
    with pytest.raises(ServiceError, match="lacks rollout") as info:
        c.rollout(ONE_LAYER)
    assert not isinstance(info.value, ValidationError)


BAD: list[tuple[str, Callable[[AttentionClient], object], str]] = [
    ("rank 4", lambda c: c.rollout(ONE_LAYER[0]), "weights: expected [layers, B, H, L, L] (5 axes"),
    ("rank 6", lambda c: c.rollout([ONE_LAYER]), "weights: expected [layers, B, H, L, L] (5 axes"),
    ("not square", lambda c: c.rollout(np.ones((1, 1, 1, 2, 3)) / 3), "weights: the last two axes"),
    ("booleans", lambda c: c.rollout(np.ones((1, 1, 1, 2, 2), bool)), "weights: must hold numbers, got booleans"),
    ("ragged", lambda c: c.rollout([[[[[1.0, 0.0], [1.0]]]]]), "weights: a ragged nested list"),
    ("text", lambda c: c.rollout([[[[["a"]]]]]), "weights: must hold numbers"),
    (
        "gradients' shape",
        lambda c: c.rollout(ONE_LAYER, gradients=np.zeros((2, 1, 1, 2, 2))),
        "gradients: shape [2, 1, 1, 2, 2] is not the weights' [1, 1, 1, 2, 2]",
    ),
    ("gradients' rank", lambda c: c.rollout(ONE_LAYER, gradients=[[1.0]]), "gradients: expected [layers, B"),
    ("rows an integer", lambda c: c.rollout(ONE_LAYER, rows=0), "rows: expected a list of integers"),  # type: ignore[arg-type]
    ("rows a string", lambda c: c.rollout(ONE_LAYER, rows="0"), "rows: expected a list of integers"),  # type: ignore[arg-type]
    ("fractional row", lambda c: c.rollout(ONE_LAYER, rows=[0.5]), "rows: expected an integer"),  # type: ignore[list-item]
    ("boolean row", lambda c: c.rollout(ONE_LAYER, rows=[True]), "rows: expected an integer"),
    ("no rows", lambda c: c.rollout(ONE_LAYER, rows=[]), "rows: empty"),
    ("residual", lambda c: c.rollout(ONE_LAYER, residual="half"), "residual: expected a number"),  # type: ignore[arg-type]
    ("discard_ratio", lambda c: c.rollout(ONE_LAYER, discard_ratio=None), "discard_ratio: expected a number"),  # type: ignore[arg-type]
    ("renormalize", lambda c: c.rollout(ONE_LAYER, renormalize=1), "renormalize: expected True or False"),  # type: ignore[arg-type]
    ("top_k", lambda c: c.rollout(ONE_LAYER, top_k=1.5), "top_k: expected an integer"),  # type: ignore[arg-type]
]


@pytest.mark.parametrize(("what", "call", "message"), BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_a_validation_error_before_any_request(
    what: str, call: Callable[[AttentionClient], object], message: str
) -> None:
    c, bodies, _ = _scripted()
    with pytest.raises(ValidationError) as info:
        call(c)
    assert bodies == [], "nothing may be sent"
    error = info.value
    assert error.status is None and message in str(error), str(error)
    assert error.errors[0]["loc"] == [message.split(":")[0]]


def test_the_async_client_sends_the_same_body_and_refuses_the_same_input() -> None:
    sync, sync_bodies, _ = _scripted()
    options: dict[str, Any] = {"head_fusion": "max", "residual": 0.75, "discard_ratio": 0.5, "rows": [0]}
    sync.rollout(ONE_LAYER, **options)
    async_bodies: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        async_bodies.append(loads(request.content))
        return httpx.Response(200, json={"rollout": _b64(ANSWER), "timing_ms": {}})

    async def main() -> RolloutResult:
        async with AsyncAttentionClient("http://test", transport=httpx.MockTransport(handler)) as c:
            with pytest.raises(ValidationError, match="5 axes"):
                await c.rollout(ONE_LAYER[0])
            return await c.rollout(ONE_LAYER, **options)

    r = asyncio.run(main())
    assert async_bodies == sync_bodies and np.array_equal(r.rollout, ANSWER)
