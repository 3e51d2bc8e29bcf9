"""Attention sessions in the client (``client.session()``, sync and async): every step equals stateless attention
over the kept positions on a live server, the block's end ends the session, and the requests on the wire (scripted
answers): the start's options with the start only, no step sent twice, ids a /v1 path can name.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from attention_client import (
    AsyncAttentionClient,
    AsyncAttentionSession,
    AttentionClient,
    AttentionSession,
    DefaultSessionStepResult,
    RetryPolicy,
    ServiceError,
    SessionStepResult,
    TransportError,
    ValidationError,
)
from attention_client.types import Normalizer

from tests.e2e.conftest import ROOT, LiveServer
from tests.live import API_KEY

Array = np.ndarray


def _draw(rng: np.random.Generator, *shapes: tuple[int, ...], dtype: Any = np.float32) -> list[Array]:
    return [rng.standard_normal(shape).astype(dtype) for shape in shapes]


def _kept(seen: int, window: int | None, sinks: int) -> list[int]:
    """The positions a cache keeps after ``seen`` appended: all, or the first ``sinks`` and the last ``window``."""
    if window is None or seen <= sinks + window:
        return list(range(seen))
    return [*range(sinks), *range(seen - window, seen)]


@pytest.fixture
def client(keyed_server: LiveServer) -> Iterator[AttentionClient]:
    with AttentionClient(keyed_server.url, api_key=API_KEY) as c:
        yield c


def _raw_delete(server: LiveServer, path: str) -> httpx.Response:
    with httpx.Client(base_url=server.url, headers={"authorization": f"Bearer {API_KEY}"}) as http:
        return http.delete(path)


# ------------------------------------------------------------------ against a live server


@pytest.mark.slow
def test_each_step_equals_stateless_attention_over_the_prefix(client: AttentionClient) -> None:
    rng = np.random.default_rng(0)
    keys: list[Array] = []
    values: list[Array] = []
    with client.session(precision="float64", sink_positions=2) as s:
        assert isinstance(s, AttentionSession) and not s.live
        for positions in [5, 1, 1, 2]:
            q, k, v = _draw(rng, (1, 4, positions, 8), (1, 2, positions, 8), (1, 2, positions, 3), dtype=np.float64)
            keys.append(k)
            values.append(v)
            r = s.step(q, k, v)
            assert isinstance(r, DefaultSessionStepResult) and r.weights is not None
            everything = np.concatenate(keys, 2), np.concatenate(values, 2)
            ref = client.attention(q, *everything, causal="bottom_right", precision="float64")
            np.testing.assert_allclose(r.output, ref.output, rtol=1e-6)
            np.testing.assert_allclose(r.weights, ref.weights, rtol=1e-6)
            np.testing.assert_allclose(r.diagnostics["sink_mass"], r.weights[..., :2].sum(-1), rtol=1e-6)
            np.testing.assert_allclose(r.diagnostics["entropy"], ref.diagnostics["entropy"], rtol=1e-6)
            seen = sum(a.shape[2] for a in keys)
            assert (r.cache_length, r.positions_seen, s.positions_seen) == (seen, seen, seen)
            assert not r.restarted and not r.ended and s.live and r.request_id and r.engine.name == "numpy"
            assert r.output.dtype == np.float64 and r.output.shape == (1, 4, positions, 3)


@pytest.mark.slow
def test_async_steps_equal_stateless_attention_with_masks_and_per_step_options(keyed_server: LiveServer) -> None:
    rng = np.random.default_rng(1)
    steps = [_draw(rng, (2, 6, 8), (2, 6, 8), (2, 6, 4))] + [_draw(rng, (2, 1, 8), (2, 1, 8), (2, 1, 4)) for _ in "abc"]

    async def main() -> list[tuple[SessionStepResult, Any]]:
        out = []
        async with (
            AsyncAttentionClient(keyed_server.url, api_key=API_KEY) as c,
            c.session(7, normalizer="entmax15") as s,
        ):
            assert isinstance(s, AsyncAttentionSession) and s.sequence_id == 7
            keys: list[Array] = []
            values: list[Array] = []
            for i, (q, k, v) in enumerate(steps):
                keys.append(k)
                values.append(v)
                seen = sum(a.shape[1] for a in keys)
                mask = np.ones((q.shape[1], seen), bool)
                mask[:, 0] = i == 0  # after the prompt, no row sees position 0
                normalizer: Normalizer | None = "softmax" if i == 2 else None
                r = await s.step(q, k, v, mask=mask, normalizer=normalizer, returns=["output"])
                ref = await c.attention(
                    q,
                    np.concatenate(keys, 1),
                    np.concatenate(values, 1),
                    mask=mask,
                    causal="bottom_right",
                    normalizer=normalizer or "entmax15",
                    returns=["output"],
                )
                out.append((r, ref))
        return out

    for r, ref in asyncio.run(main()):
        assert r.output is not None and ref.output is not None and r.output.dtype == np.float32
        np.testing.assert_allclose(r.output, ref.output, rtol=1e-6)
        assert r.weights is None and r.diagnostics is None
    assert [r.positions_seen for r, _ in asyncio.run(main())] == [6, 7, 8, 9]  # the same id starts afresh


@pytest.mark.slow
def test_a_window_with_sinks_keeps_the_cache_bounded(client: AttentionClient) -> None:
    rng = np.random.default_rng(2)
    window, sinks = 3, 2
    keys: list[Array] = []
    values: list[Array] = []
    with client.session(window=window, sinks=sinks) as s:
        for step in range(9):
            n = 4 if step == 0 else 1
            q, k, v = _draw(rng, (2, n, 4), (2, n, 4), (2, n, 4))
            keys.append(k)
            values.append(v)
            r = s.step(q, k, v, returns=["output", "weights"])
            seen = 3 + step + 1
            kept = _kept(seen, window, sinks)
            assert (r.positions_seen, r.cache_length) == (seen, len(kept)) and r.cache_length <= window + sinks
            everything_k, everything_v = np.concatenate(keys, 1), np.concatenate(values, 1)
            ref = client.attention(q, everything_k[:, kept], everything_v[:, kept], causal="bottom_right")
            assert r.output is not None and r.weights is not None and r.weights.shape[-1] == len(kept)
            np.testing.assert_allclose(r.output, ref.output, rtol=1e-6)


@pytest.mark.slow
def test_leaving_the_block_ends_the_session(client: AttentionClient, keyed_server: LiveServer) -> None:
    q = np.eye(2, dtype=np.float32)
    with client.session("client-ends-it") as s:
        s.step(q, q, q)
        s.step(q[:1], q[:1], q[:1])
    assert not s.live and s.cache_length == 0 and s.positions_seen == 3
    gone = _raw_delete(keyed_server, "/v1/sessions/client-ends-it")
    assert gone.status_code == 404 and "has ended" in gone.json()["detail"]
    with pytest.raises(ValidationError) as info:  # the client knows: nothing is sent
        s.step(q, q, q)
    assert info.value.status is None and "has ended" in info.value.detail and "start=True" in info.value.detail
    with pytest.raises(ValidationError) as info:  # the server knows too
        client.session("client-ends-it").step(q, q, q, start=False)
    assert info.value.status == 422 and "sequence 'client-ends-it' has ended" in info.value.detail
    again = s.step(q, q, q, start=True)  # an explicit start begins it again
    assert again.positions_seen == 2 and not again.restarted and s.live
    assert s.end() == 2 and s.end() is None and not s.live


@pytest.mark.slow
def test_an_exception_in_the_block_ends_the_session_and_propagates(client: AttentionClient) -> None:
    q = np.eye(2, dtype=np.float32)
    with pytest.raises(KeyError), client.session(424242) as s:
        s.step(q, q, q)
        raise KeyError("the caller's own error")
    assert not s.live
    with pytest.raises(ValidationError, match="has ended"):
        client.session(424242).step(q, q, q, start=False)


@pytest.mark.slow
def test_an_evicted_or_ended_session_is_not_an_error_at_the_end(
    client: AttentionClient, keyed_server: LiveServer
) -> None:
    q = np.eye(2, dtype=np.float32)
    with client.session() as s:
        s.step(q, q, q)
        ended = _raw_delete(keyed_server, f"/v1/sessions/{s.sequence_id}")  # another client ends it
        assert ended.json() == {"sequence_id": s.sequence_id, "positions_seen": 2}
        assert s.live  # as far as this session knows
    assert not s.live  # its DELETE was a 404, not an error
    with client.session(99) as t:
        r = t.step(q, q, q, end=True)
        assert r.ended and r.cache_length == 0 and not t.live
    assert t.end() is None


@pytest.mark.slow
def test_fresh_ids_differ_and_their_caches_are_apart(client: AttentionClient) -> None:
    one, two = client.session(), client.session()
    assert isinstance(one.sequence_id, str) and isinstance(two.sequence_id, str)
    assert one.sequence_id != two.sequence_id and one.sequence_id.startswith("session-")
    q = np.eye(2, dtype=np.float32)
    with one, two:
        one.step(q, q, q)
        assert two.step(q[:1], q[:1], q[:1]).positions_seen == 1
        assert one.step(q[:1], q[:1], q[:1]).positions_seen == 3


@pytest.mark.slow
def test_a_restart_drops_the_live_cache(client: AttentionClient) -> None:
    q = np.eye(2, dtype=np.float32)
    with client.session() as s:
        s.step(q, q, q)
        r = s.step(q[:1], q[:1], q[:1], start=True)
        assert r.restarted and r.positions_seen == 1 and r.cache_length == 1


@pytest.mark.slow
def test_refusals_are_validation_errors_with_the_servers_detail(client: AttentionClient) -> None:
    q = np.ones((1, 2, 4), np.float32)
    with client.session("refusals") as s:
        s.step(q, q, q)
        with pytest.raises(ValidationError) as info:
            s.step(q[..., :3], q[..., :3], q)  # another head size
        assert info.value.status == 422 and "'refusals''s cache has head size (last axis) 4" in info.value.detail
        assert info.value.request_id
        assert s.step(q, q, q).positions_seen == 4  # the refused step left the cache as it was
    with pytest.raises(ValidationError) as info:
        client.session("never-started").step(q, q, q, start=False)
    assert info.value.status == 422 and "'never-started' is not live: it was never started" in info.value.detail
    with pytest.raises(ValidationError) as info:
        client.session(normalizer="entmax").step(q, q, q)  # entmax without alpha
    assert info.value.status == 422 and "alpha" in info.value.detail


# ------------------------------------------------------------------ requests on the wire (scripted answers)


def _answer(body: dict[str, Any], ended: bool = False) -> dict[str, Any]:
    seen = 3
    return {
        "output": {"shape": [1, 2], "dtype": "float32", "b64": "AACAPwAAAEA="},
        "diagnostics": {"sink_mass": [1.0]},
        "cache_length": 0 if ended else seen,
        "positions_seen": seen,
        "restarted": False,
        "ended": ended,
        "engine": {"name": "numpy", "provider": "CPU/numpy", "reason": "r"},
        "timing_ms": {"total": 1.0},
    }


class Recorder:
    """A scripted server: answers each step from its body and each DELETE with 200 (or ``delete_status``)."""

    def __init__(self, delete_status: int = 200, fail: list[Exception] | None = None) -> None:
        self.requests: list[tuple[str, str, dict[str, Any] | None]] = []
        self.routed: list[str | None] = []
        self.delete_status = delete_status
        self.fail = fail or []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        self.requests.append((request.method, request.url.raw_path.decode(), body))
        self.routed.append(request.headers.get("x-sequence-id"))
        if self.fail:
            raise self.fail.pop(0)
        if request.method == "DELETE":
            return httpx.Response(self.delete_status, json={"sequence_id": 1, "positions_seen": 3})
        assert body is not None
        return httpx.Response(200, json=_answer(body, ended=body.get("end", False)))


def _scripted(recorder: Recorder, **kwargs: Any) -> AttentionClient:
    c = AttentionClient("http://test", transport=httpx.MockTransport(recorder), **kwargs)
    c._sleep = lambda seconds: None
    return c


def test_the_start_carries_the_sessions_options_and_later_steps_do_not() -> None:
    rec = Recorder()
    q = np.ones((1, 2), np.float32)
    with (
        _scripted(rec) as c,
        c.session(
            "chat 1-ä",
            window=8,
            sinks=2,
            sink_positions=3,
            scale=0.5,
            normalizer="entmax",
            alpha=1.2,
            precision="float64",
        ) as s,
    ):
        s.step(q, q, q)
        s.step(q, q, q, temperature=2.0, mask=np.ones((1, 1), bool), returns=["output"], request_id="step-2")
        s.step(q, q, q, end=True)
    first, second, third = (body for _, _, body in rec.requests)
    assert [(m, p) for m, p, _ in rec.requests] == [("POST", "/v1/sessions/chat%201-%C3%A4/steps")] * 3  # no DELETE
    assert rec.routed == ["chat%201-%C3%A4"] * 3  # X-Sequence-ID: a proxy routes a sequence's steps alike
    assert first is not None and second is not None and third is not None
    options = {"scale": 0.5, "temperature": 1.0, "normalizer": "entmax", "alpha": 1.2, "engine": "auto"}
    assert {k: first[k] for k in options} == options and first["precision"] == "float64"
    assert (first["start"], first["window"], first["sinks"], first["sink_positions"]) == (True, 8, 2, 3)
    assert first["encoding"] == "base64" and "end" not in first and "return" not in first and "mask" not in first
    assert not {"start", "window", "sinks", "sink_positions", "end"} & second.keys()
    assert second["temperature"] == 2.0 and second["return"] == ["output"] and second["mask"]["dtype"] == "bool"
    assert second["normalizer"] == "entmax" and second["precision"] == "float64"
    assert third["end"] is True and "start" not in third
    assert not s.live


def test_a_step_is_not_sent_again_after_a_failure_that_may_have_reached_the_server() -> None:
    q = np.ones((1, 2), np.float32)
    rec = Recorder(fail=[httpx.ReadError("reset")])
    with _scripted(rec, retry=RetryPolicy(max_retries=3)) as c:
        s = c.session()
        with pytest.raises(TransportError):
            s.step(q, q, q)
        assert len(rec.requests) == 1 and not s.live
        rec.fail = [httpx.ConnectError("refused")]  # never reached the server: sent again
        assert s.step(q, q, q).positions_seen == 3 and len(rec.requests) == 3 and s.live
        rec.fail = [httpx.ReadError("reset")]  # the end is sent again: ending twice is harmless
        assert s.end() == 3 and [m for m, _, _ in rec.requests][-2:] == ["DELETE", "DELETE"]
        rec.fail = [httpx.ReadError("reset")]  # other calls are still sent again after a read error
        c._post("/v1/attention", {}, lambda body, rid: body, None, None)
        assert len(rec.requests) == 7


def test_a_404_at_the_end_is_not_an_error_and_a_failed_end_can_be_retried() -> None:
    q = np.ones((1, 2), np.float32)
    rec = Recorder(delete_status=404)
    with _scripted(rec) as c, c.session(5) as s:
        s.step(q, q, q)
    assert [(m, p) for m, p, _ in rec.requests] == [("POST", "/v1/sessions/5/steps"), ("DELETE", "/v1/sessions/5")]
    assert rec.routed == ["5", "5"]
    assert not s.live
    rec = Recorder(delete_status=500)
    with _scripted(rec, retry=RetryPolicy(max_retries=0)) as c:
        s = c.session(5)
        s.step(q, q, q)
        with pytest.raises(ServiceError) as info:
            s.end()
        assert info.value.status == 500 and s.live  # still live: end() may be called again
        rec.delete_status = 200
        assert s.end() == 3 and not s.live
    never = Recorder()
    with _scripted(never) as c, c.session():
        pass
    assert never.requests == []  # never started: nothing to end


@pytest.mark.parametrize(
    ("sequence_id", "why"),
    [
        ("7", "would name the integer id 7"),
        ("18446744073709551615", "would name the integer id"),
        ("", "a path cannot carry it"),
        ("a/b", "a path cannot carry it"),
        ("..", "a path cannot carry it"),
        (0, "1 .. 2^64 - 1"),
        (-3, "1 .. 2^64 - 1"),
        (1 << 64, "1 .. 2^64 - 1"),
        (True, "expected an integer"),
        (2.5, "1 .. 2^64 - 1"),
    ],
)
def test_ids_a_path_cannot_name_are_refused_before_sending(sequence_id: Any, why: str) -> None:
    rec = Recorder()
    with _scripted(rec) as c, pytest.raises(ValidationError) as info:
        c.session(sequence_id)
    assert info.value.status is None and why in info.value.detail and info.value.errors[0]["loc"] == ["sequence_id"]
    assert rec.requests == []


def test_ids_a_path_can_name() -> None:
    rec = Recorder()
    q = np.ones((1, 2), np.float32)
    with _scripted(rec) as c:
        for sequence_id, path in [
            (7, "/v1/sessions/7"),
            (np.uint64((1 << 64) - 1), "/v1/sessions/18446744073709551615"),
            ("007", "/v1/sessions/007"),
            ("-5", "/v1/sessions/-5"),
            ("a?b#c d", "/v1/sessions/a%3Fb%23c%20d"),
        ]:
            s = c.session(sequence_id)  # type: ignore[arg-type]  # a numpy integer too
            assert s.sequence_id == sequence_id
            assert type(s.sequence_id) is (str if isinstance(sequence_id, str) else int)
            s.step(q, q, q)
            assert rec.requests[-1][1] == path + "/steps"


def test_options_of_the_wrong_type_are_refused_before_sending() -> None:
    rec = Recorder()
    with _scripted(rec) as c:
        with pytest.raises(ValidationError, match="window: expected an integer"):
            c.session(window="8")  # type: ignore[arg-type]
        s = c.session()
        with pytest.raises(ValidationError, match="temperature: expected a number"):
            s.step([1.0], [1.0], [1.0], temperature="hot")  # type: ignore[call-overload]
        with pytest.raises(ValidationError, match="query"):
            s.step([[1.0], [1.0, 2.0]], [1.0], [1.0])
    assert rec.requests == [] and not s.live


def test_the_async_session_sends_what_the_sync_one_does() -> None:
    rec = Recorder()
    q = np.ones((1, 2), np.float32)

    async def main() -> None:
        async with (
            AsyncAttentionClient("http://test", transport=httpx.MockTransport(rec)) as c,
            c.session("a", window=4) as s,
        ):
            assert repr(s) == "AsyncAttentionSession('a', not started, positions_seen=0)"
            r = await s.step(q, q, q)
            assert isinstance(r, DefaultSessionStepResult) and r.output.tolist() == [[1.0, 2.0]]
            assert r.diagnostics["sink_mass"] == [1.0] and r.engine.name == "numpy" and s.live
            await s.step(q, q, q)

    asyncio.run(main())
    assert [(m, p) for m, p, _ in rec.requests] == [
        ("POST", "/v1/sessions/a/steps"),
        ("POST", "/v1/sessions/a/steps"),
        ("DELETE", "/v1/sessions/a"),
    ]
    assert rec.routed == ["a", "a", "a"]
    first, second = rec.requests[0][2], rec.requests[1][2]
    assert first is not None and second is not None
    assert first["start"] is True and first["window"] == 4 and "start" not in second and "window" not in second


TYPED = """
from typing import Any, assert_type
import numpy.typing as npt
from attention_client import (
    AsyncAttentionClient, AsyncAttentionSession, AttentionClient, AttentionSession, SessionDiagnostics,
    SessionStepResult,
)
from attention_client.results import RowValues

def sync(c: AttentionClient) -> None:
    with c.session("chat-1", window=8) as s:
        assert_type(s, AttentionSession)
        r = s.step([[1.0]], [[1.0]], [[1.0]])
        assert_type(r.output, npt.NDArray[Any])
        assert_type(r.weights, npt.NDArray[Any] | None)
        assert_type(r.diagnostics, SessionDiagnostics)
        assert_type(r.diagnostics["sink_mass"], RowValues)
        assert_type(r.cache_length, int)
        named = s.step([[1.0]], [[1.0]], [[1.0]], returns=["output"], end=True)
        assert_type(named, SessionStepResult)
        assert_type(named.output, npt.NDArray[Any] | None)
        assert_type(s.end(), int | None)
        assert_type(s.sequence_id, int | str)

async def asynchronous(c: AsyncAttentionClient) -> None:
    async with c.session(7) as s:
        assert_type(s, AsyncAttentionSession)
        r = await s.step([[1.0]], [[1.0]], [[1.0]], normalizer="entmax15")
        assert_type(r.output, npt.NDArray[Any])
        assert_type(await s.end(), int | None)
"""


@pytest.mark.slow
def test_sessions_are_typed_precisely(tmp_path: Path) -> None:
    """Strict mypy on a user's code: a default step's output and diagnostics are not Optional."""
    sample = tmp_path / "user_code.py"
    sample.write_text(textwrap.dedent(TYPED))
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(tmp_path / "cache"), str(sample)],
        env={**os.environ, "MYPYPATH": str(ROOT / "clients" / "python")},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
