"""Attention sessions over REST (/v2 ``attention_session`` and /v1 ``/v1/sessions``): every step equals the stateless
attention over the positions the cache keeps (``causal: bottom_right``), and every refusal names its cause.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.core.attention import run_attention
from service.core.types import AttentionInputs, AttentionParams, AttentionTask
from service.settings import Settings

KEYS = ["k" * 32, "j" * 32]
INFER = "/v2/models/attention_session/infer"
DATATYPE = {np.dtype(np.float32): "FP32", np.dtype(np.float64): "FP64"}


class ReadyClient(TestClient):
    """A TestClient that, once entered, waits for the app's engines (a /v2 inference before them is a 503)."""

    def __enter__(self) -> ReadyClient:
        super().__enter__()
        deadline = time.monotonic() + 30
        while self.get("/readyz").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.02)
        return self


def app_client(**settings: Any) -> ReadyClient:
    return ReadyClient(create_app(Settings(enable_onnx=False, grpc_enabled=False, **settings)))


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with app_client() as c:
        yield c


def tensor(name: str, arr: np.ndarray) -> dict[str, Any]:
    if arr.dtype == bool:
        return {"name": name, "shape": list(arr.shape), "datatype": "BOOL", "data": arr.ravel().tolist()}
    return {"name": name, "shape": list(arr.shape), "datatype": DATATYPE[arr.dtype], "data": arr.ravel().tolist()}


def infer(client: TestClient, arrays: dict[str, np.ndarray], headers: dict[str, str] | None = None, **params: Any):
    body = {"inputs": [tensor(n, a) for n, a in arrays.items()], "parameters": params}
    return client.post(INFER, json=body, headers=headers or {})


def outputs(response) -> dict[str, np.ndarray]:
    assert response.status_code == 200, response.text
    body = response.json()
    dtypes = {"FP32": np.float32, "FP64": np.float64, "INT64": np.int64}
    return {o["name"]: np.array(o["data"], dtype=dtypes[o["datatype"]]).reshape(o["shape"]) for o in body["outputs"]}


def stateless(q, k, v, mask, normalizer: str, alpha=None, temperature=1.0):
    """The reference: service.core's attention over the kept positions, aligned bottom_right."""
    params = AttentionParams(normalizer=normalizer, alpha=alpha, temperature=temperature, causal="bottom_right")
    task = AttentionTask(AttentionInputs(q, k, v, mask=mask), params, dtype=q.dtype, need_weights=True)
    result = run_attention(task)
    return result.output, result.weights


def kept(seen: int, window: int | None, sinks: int) -> np.ndarray:
    if window is None:
        return np.arange(seen)
    first = np.arange(min(sinks, seen))
    rest = np.arange(len(first), seen)
    return np.concatenate([first, rest[max(0, len(rest) - window) :]])


CASES = [
    # (normalizer, alpha, dtype, Hq, Hkv, window, sinks, with a mask)
    ("softmax", None, np.float32, 4, 2, None, 0, False),
    ("softmax", None, np.float64, 2, 2, 6, 2, True),
    ("sparsemax", None, np.float32, 2, 1, None, 0, True),
    ("entmax15", None, np.float64, 2, 2, 5, 0, False),
    ("entmax", 1.7, np.float32, 2, 2, None, 0, False),
    ("relu", None, np.float32, 4, 1, 7, 4, False),
]


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{np.dtype(c[2]).name}-w{c[5]}" for c in CASES])
def test_every_step_equals_stateless_attention_over_the_kept_positions(client: TestClient, case) -> None:
    normalizer, alpha, dtype, hq, hkv, window, sinks, with_mask = case
    rng = np.random.default_rng(hash(case) % 2**32)
    B, E, Ev = 2, 8, 4
    seq = f"cases-{normalizer}-{np.dtype(dtype).name}-{window}"
    all_k = np.zeros((B, hkv, 0, E), dtype)
    all_v = np.zeros((B, hkv, 0, Ev), dtype)
    tol = {"rtol": 2e-6, "atol": 2e-7} if dtype == np.float32 else {"rtol": 1e-12, "atol": 1e-13}
    for step in range(8):
        m = int(rng.choice([1, 1, 2, 3])) if step else 5
        q = rng.standard_normal((B, hq, m, E)).astype(dtype)
        k = rng.standard_normal((B, hkv, m, E)).astype(dtype)
        v = rng.standard_normal((B, hkv, m, Ev)).astype(dtype)
        all_k, all_v = np.concatenate([all_k, k], 2), np.concatenate([all_v, v], 2)
        idx = kept(all_k.shape[2], window, sinks)
        arrays = {"query": q, "key": k, "value": v}
        mask = None
        if with_mask:
            mask = rng.random((B, 1, m, len(idx))) < 0.8
            arrays["mask"] = mask
        params: dict[str, Any] = {"sequence_id": seq, "sequence_start": step == 0, "normalizer": normalizer}
        if alpha is not None:
            params["alpha"] = alpha
        if step == 0 and window is not None:
            params.update(window=window, sinks=sinks)
        got = outputs(infer(client, arrays, **params))
        want_out, want_w = stateless(q, all_k[:, :, idx], all_v[:, :, idx], mask, normalizer, alpha)
        np.testing.assert_allclose(got["output"], want_out, **tol)
        np.testing.assert_allclose(got["weights"], want_w, **tol)
        assert got["cache_length"].tolist() == [len(idx)]
        assert got["positions_seen"].tolist() == [all_k.shape[2]]


def test_interleaved_sequences_never_see_each_other(client: TestClient) -> None:
    rng = np.random.default_rng(1)
    caches: dict[Any, list[np.ndarray]] = {11: [], "eleven": []}
    for step in range(6):
        for seq in caches:
            q, k, v = (rng.standard_normal((1, 2, 1, 4)).astype(np.float32) for _ in range(3))
            caches[seq].append(np.stack([k, v]))
            got = outputs(infer(client, {"query": q, "key": k, "value": v}, sequence_id=seq, sequence_start=step == 0))
            ks = np.concatenate([c[0] for c in caches[seq]], 2)
            vs = np.concatenate([c[1] for c in caches[seq]], 2)
            np.testing.assert_allclose(got["output"], stateless(q, ks, vs, None, "softmax")[0], rtol=2e-6, atol=2e-7)


def step(rng: np.random.Generator, hkv: int = 1, e: int = 4, dtype: Any = np.float32) -> dict[str, np.ndarray]:
    return {
        "query": rng.standard_normal((1, hkv, 1, e)).astype(dtype),
        "key": rng.standard_normal((1, hkv, 1, e)).astype(dtype),
        "value": rng.standard_normal((1, hkv, 1, e)).astype(dtype),
    }


def error(response, status: int) -> str:
    assert response.status_code == status, response.text
    return response.json()["error"]


def test_refusals_name_the_sequence_and_why(client: TestClient) -> None:
    rng = np.random.default_rng(2)
    assert "never started" in error(infer(client, step(rng), sequence_id=404), 400)
    outputs(infer(client, step(rng), sequence_id=5, sequence_start=True))
    assert "never started" in error(infer(client, step(rng), sequence_id="5"), 400)  # "5" is not 5
    assert "key heads" in error(infer(client, step(rng, hkv=2), sequence_id=5), 400)
    assert "head size" in error(infer(client, step(rng, e=8), sequence_id=5), 400)
    assert "precision" in error(infer(client, step(rng, dtype=np.float64), sequence_id=5), 400)
    assert "set at a sequence's start" in error(infer(client, step(rng), sequence_id=5, window=4), 400)
    ended = outputs(client.post(INFER, json={"inputs": [], "parameters": {"sequence_id": 5, "sequence_end": True}}))
    assert ended["positions_seen"].tolist() == [1] and ended["cache_length"].tolist() == [0]
    assert "has ended" in error(infer(client, step(rng), sequence_id=5), 400)
    assert "needs a sequence" in error(infer(client, step(rng), sequence_id=0), 400)
    stateless_refusal = error(
        client.post(
            "/v2/models/attention/infer",
            json={"inputs": [tensor(n, a) for n, a in step(rng).items()], "parameters": {"sequence_id": 9}},
        ),
        400,
    )
    assert "stateless" in stateless_refusal and "attention_session" in stateless_refusal


def test_a_start_on_a_live_id_restarts_it(client: TestClient) -> None:
    rng = np.random.default_rng(3)
    outputs(infer(client, step(rng), sequence_id=77, sequence_start=True))
    outputs(infer(client, step(rng), sequence_id=77))
    again = infer(client, step(rng), sequence_id=77, sequence_start=True)
    assert again.json()["parameters"]["sequence_restarted"] is True
    assert outputs(again)["cache_length"].tolist() == [1]


def test_a_refused_step_leaves_the_cache_as_it_was(client: TestClient) -> None:
    """A step whose scores overflow float32 is refused after its append: the cache is rolled back."""
    rng = np.random.default_rng(4)
    first = step(rng)
    outputs(infer(client, first, sequence_id=88, sequence_start=True))
    bad = {name: np.full((1, 1, 1, 4), 1e30, np.float32) for name in ("query", "key", "value")}
    assert "overflow" in error(infer(client, bad, sequence_id=88), 400)
    nxt = step(rng)
    got = outputs(infer(client, nxt, sequence_id=88))
    assert got["positions_seen"].tolist() == [2]
    ks = np.concatenate([first["key"], nxt["key"]], 2)
    vs = np.concatenate([first["value"], nxt["value"]], 2)
    np.testing.assert_allclose(got["output"], stateless(nxt["query"], ks, vs, None, "softmax")[0], rtol=2e-6)


def test_sink_mass_is_the_weight_on_the_first_positions(client: TestClient) -> None:
    rng = np.random.default_rng(5)
    seen = []
    for i in range(6):
        arrays = step(rng)
        seen.append(arrays)
        response = infer(client, arrays, sequence_id="sinks", sequence_start=i == 0, sink_positions=2)
        weights = outputs(response)["weights"]
    diagnostics = response.json()["parameters"]["diagnostics"]
    import orjson

    sink_mass = np.array(orjson.loads(diagnostics)["sink_mass"])
    np.testing.assert_allclose(sink_mass, weights[..., :2].sum(-1), rtol=1e-6)


def test_idle_sessions_are_evicted_and_say_so() -> None:
    rng = np.random.default_rng(6)
    with app_client(session_idle_s=0.2) as c:
        outputs(infer(c, step(rng), sequence_id=1, sequence_start=True))
        time.sleep(1.0)
        message = error(infer(c, step(rng), sequence_id=1), 400)
        assert "was evicted" in message and "without a step" in message and "ATTN_SESSION_IDLE_S" in message
        metrics = c.get("/metrics").text
        assert 'attn_session_evictions_total{reason="idle"} 1.0' in metrics
        assert "attn_sessions_live 0.0" in metrics


def test_a_full_cache_budget_evicts_the_least_recently_used_idle_session() -> None:
    rng = np.random.default_rng(7)
    big = {n: rng.standard_normal((1, 4, 2048, 32)).astype(np.float32) for n in ("query", "key", "value")}
    big["query"] = big["query"][:, :, :1]
    with app_client(session_cache_bytes=3 << 20, max_work_flops=1e12) as c:  # each cache: 2048 * 4 * 64 * 4 = 2 MiB
        outputs(infer(c, big, sequence_id="a", sequence_start=True))
        outputs(infer(c, big, sequence_id="b", sequence_start=True))  # no room: "a" (idle) makes way
        message = error(infer(c, step(rng, hkv=4, e=32), sequence_id="a"), 400)
        assert "to make room for another session's cache" in message
        # "b" cannot double (4 MiB) within 3 MiB: it grows by the one position its step needs
        assert outputs(infer(c, step(rng, hkv=4, e=32), sequence_id="b"))["cache_length"].tolist() == [2049]
        outputs(infer(c, big, sequence_id="c", sequence_start=True))  # "b" is evicted for "c" in turn
        refused = infer(c, big, sequence_id="c")  # "c" alone, and 4096 positions do not fit: 503, nothing to evict
        assert "no other session is idle to evict" in error(refused, 503)
        assert refused.headers["retry-after"]


def test_caps_positions_and_sessions_per_key() -> None:
    rng = np.random.default_rng(8)
    with app_client(session_max_positions=3, session_max_per_key=2) as c:
        for i in range(3):
            outputs(infer(c, step(rng), sequence_id="p", sequence_start=i == 0))
        assert "ATTN_SESSION_MAX_POSITIONS" in error(infer(c, step(rng), sequence_id="p"), 413)
        outputs(infer(c, step(rng), sequence_id="q", sequence_start=True))
        refused = infer(c, step(rng), sequence_id="r", sequence_start=True)
        assert "ATTN_SESSION_MAX_PER_KEY" in error(refused, 503)
        assert refused.headers["retry-after"]


def test_a_sequence_belongs_to_the_key_that_started_it() -> None:
    rng = np.random.default_rng(9)
    first, second = ({"authorization": f"Bearer {key}"} for key in KEYS)
    with app_client(api_keys=KEYS) as c:
        outputs(infer(c, step(rng), first, sequence_id=3, sequence_start=True))
        assert "never started" in error(infer(c, step(rng), second, sequence_id=3), 400)
        outputs(infer(c, step(rng), second, sequence_id=3, sequence_start=True))  # its own sequence 3
        assert outputs(infer(c, step(rng), first, sequence_id=3))["cache_length"].tolist() == [2]


def test_server_metadata_lists_the_sequence_extension(client: TestClient) -> None:
    assert {"sequence", "sequence(string_id)"} <= set(client.get("/v2").json()["extensions"])
    with app_client(sessions=False) as c:
        assert "sequence" not in c.get("/v2").json()["extensions"]
        assert "does not serve attention sessions" in error(
            infer(c, step(np.random.default_rng(0)), sequence_id=1, sequence_start=True), 400
        )


def test_the_v1_form_starts_steps_and_ends_a_session(client: TestClient) -> None:
    body = {"start": True, "query": [[1.0, 0.0]], "key": [[1.0, 0.0]], "value": [[1.0, 2.0]]}
    first = client.post("/v1/sessions/chat-1/steps", json=body)
    assert first.status_code == 200, first.text
    assert first.json()["cache_length"] == 1 and first.json()["diagnostics"]["sink_mass"] == [1.0]
    second = client.post(
        "/v1/sessions/chat-1/steps",
        json={"query": [[0.0, 1.0]], "key": [[0.0, 1.0]], "value": [[3.0, 4.0]], "return": ["output", "weights"]},
    ).json()
    q = np.array([[0.0, 1.0]], np.float32)
    k = np.array([[1.0, 0.0], [0.0, 1.0]], np.float32)
    v = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
    want_out, want_w = stateless(q, k, v, None, "softmax")
    np.testing.assert_allclose(second["output"], want_out, rtol=1e-6)
    np.testing.assert_allclose(second["weights"], want_w, rtol=1e-6)
    assert "diagnostics" not in second
    ended = client.delete("/v1/sessions/chat-1")
    assert ended.json() == {"sequence_id": "chat-1", "positions_seen": 2}
    gone = client.post(
        "/v1/sessions/chat-1/steps", json={"query": [[0.0, 1.0]], "key": [[0.0, 1.0]], "value": [[3.0, 4.0]]}
    )
    assert gone.status_code == 422 and "has ended" in gone.json()["detail"]
    assert client.delete("/v1/sessions/chat-1").status_code == 404
    # a path of digits names the integer id that tritonclient's sequence_id=12 names
    assert client.post("/v1/sessions/12/steps", json=body).status_code == 200
    assert outputs(infer(client, step(np.random.default_rng(0), e=2), sequence_id=12))["cache_length"].tolist() == [2]


def test_concurrent_steps_of_one_sequence_run_one_at_a_time(client: TestClient) -> None:
    """Eight steps sent at once: each sees a distinct cache (one at a time), and each equals the stateless
    attention over the prefix in the order they ran (read from their cache lengths).
    """
    from concurrent.futures import ThreadPoolExecutor

    rng = np.random.default_rng(10)
    first = step(rng)
    outputs(infer(client, first, sequence_id="together", sequence_start=True))
    steps = [step(rng) for _ in range(8)]
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda arrays: outputs(infer(client, arrays, sequence_id="together")), steps))
    lengths = [int(a["cache_length"][0]) for a in answers]
    assert sorted(lengths) == list(range(2, 10))
    order = sorted(range(8), key=lambda i: lengths[i])
    keys, values = [first["key"]], [first["value"]]
    for i in order:
        keys.append(steps[i]["key"])
        values.append(steps[i]["value"])
        want = stateless(steps[i]["query"], np.concatenate(keys, 2), np.concatenate(values, 2), None, "softmax")[0]
        np.testing.assert_allclose(answers[i]["output"], want, rtol=2e-6, atol=2e-7)


def test_every_form_refuses_partial_tensors_and_a_lone_mask(client: TestClient) -> None:
    """One rule for both forms: query, key and value together or none (an end), and no mask without them; a mask
    with an end and no tensors would mask nothing, so it is refused, never ignored.
    """
    rng = np.random.default_rng(11)
    outputs(infer(client, step(rng), sequence_id="partial", sequence_start=True))
    arrays = step(rng)
    del arrays["value"]
    assert "'value' is missing" in error(infer(client, arrays, sequence_id="partial"), 400)
    lone = {"mask": np.ones((1, 2), bool)}
    assert "'mask' needs query, key and value" in error(
        infer(client, lone, sequence_id="partial", sequence_end=True), 400
    )
    v1 = client.post("/v1/sessions/partial/steps", json={"end": True, "mask": [[True, True]]})
    assert v1.status_code == 422 and "'mask' needs query, key and value" in v1.json()["detail"]
    partial = client.post("/v1/sessions/partial/steps", json={"query": [[1.0, 0.0]], "key": [[1.0, 0.0]]})
    assert partial.status_code == 422 and "'value' is missing" in partial.json()["detail"]
    assert client.delete("/v1/sessions/partial").json()["positions_seen"] == 1  # nothing refused was appended
