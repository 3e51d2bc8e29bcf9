"""The client fails early and in its own terms: bad input is a ValidationError before any request, an
address without a scheme works, ``ready()`` is False when nothing answers, results are typed precisely.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from attention_client import (
    AsyncAttentionClient,
    AttentionClient,
    DefaultAttentionResult,
    DefaultBackwardResult,
    ServiceError,
    ValidationError,
)

from tests.e2e.conftest import ROOT, free_port

CLIENT = ROOT / "clients" / "python"

ANSWER = {
    "output": [[1.0, 2.0]],
    "weights": [[1.0]],
    "diagnostics": {"heads": [], "entropy": [0.0]},
    "engine": {"name": "numpy", "provider": "CPU/numpy", "reason": "asked"},
    "timing_ms": {"total": 1.0},
}


def _recording(answer: dict[str, Any] | None = None) -> tuple[AttentionClient, list[httpx.Request]]:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=answer if answer is not None else ANSWER)

    return AttentionClient("http://test", transport=httpx.MockTransport(handler)), seen


ONE = ([[1.0]], [[1.0]], [[1.0]])

BAD_CALLS: list[tuple[str, Callable[[AttentionClient], object], str]] = [
    ("ragged", lambda c: c.attention([[1.0, 2.0], [3.0]], [[1.0, 2.0]], [[1.0]]), "query: a ragged nested list"),
    ("text", lambda c: c.softmax(["1", "2"]), "logits: must hold numbers"),
    ("None entry", lambda c: c.softmax([1.0, None]), "logits: must hold numbers"),
    ("complex", lambda c: c.softmax(np.array([1j])), "logits: must hold numbers (or booleans for a mask), got complex"),
    ("ragged mask", lambda c: c.softmax([1.0, 2.0], mask=[[True], [True, False]]), "mask: a ragged"),
    (
        "text option",
        lambda c: c.attention([[1.0]], [[1.0]], [[1.0]], temperature="hot"),
        "temperature: expected a number",
    ),  # type: ignore[arg-type]
    ("bool for a number", lambda c: c.softmax([1.0], axis=True), "axis: expected an integer"),
    (
        "key lengths",
        lambda c: c.attention([[1.0]], [[1.0]], [[1.0]], key_lengths=["x"]),
        "key_lengths: expected an integer",
    ),  # type: ignore[list-item]
    ("causal", lambda c: c.attention([[1.0]], [[1.0]], [[1.0]], causal="diagonal"), "causal: expected"),  # type: ignore[arg-type]
    ("labels", lambda c: c.calibrate([[1.0, 0.0]], [0.5]), "labels: expected an integer"),
    ("previous tokens", lambda c: c.sample([1.0, 2.0], previous_tokens="0,1"), "previous_tokens: expected"),  # type: ignore[arg-type]
    ("analyze without key", lambda c: c.analyze([[1.0]]), "key: give both query and key"),
    ("analyze with nothing", lambda c: c.analyze(), "shape: give query and key"),
    (
        "grad_output",
        lambda c: c.attention_backward([[1.0]], [[1.0]], [[1.0]], [["a"]]),
        "grad_output: must hold numbers",
    ),
    ("ragged token ids", lambda c: c.attention(*ONE, token_ids=[[1, 2], [3]]), "token_ids: a ragged nested list"),
    ("text token ids", lambda c: c.attention(*ONE, token_ids=[["a", "b"]]), "token_ids: must hold numbers"),
    ("token ids as a string", lambda c: c.attention(*ONE, token_ids="1 2"), "token_ids: expected [B, S]"),  # type: ignore[arg-type]
    ("fractional token ids", lambda c: c.attention(*ONE, token_ids=[[1.5]]), "token_ids: expected integer"),
    ("boolean token ids", lambda c: c.attention(*ONE, token_ids=[[True]]), "token_ids: expected integer"),
    ("one axis of token ids", lambda c: c.attention(*ONE, token_ids=[1, 2]), "token_ids: expected [B, S]"),
    ("sink positions", lambda c: c.attention(*ONE, sink_positions="4"), "sink_positions: expected an integer"),  # type: ignore[arg-type]
    ("bool sink positions", lambda c: c.attention(*ONE, sink_positions=True), "sink_positions: expected an integer"),
    ("exclude_bos", lambda c: c.attention(*ONE, exclude_bos="yes"), "exclude_bos: expected True or False"),  # type: ignore[arg-type]
    (
        "exclude_current_token",
        lambda c: c.attention(*ONE, exclude_current_token=1),  # type: ignore[arg-type]
        "exclude_current_token: expected True or False",
    ),
]


@pytest.mark.parametrize(("what", "call", "message"), BAD_CALLS, ids=[b[0] for b in BAD_CALLS])
def test_bad_input_is_a_validation_error_before_any_request(
    what: str, call: Callable[[AttentionClient], object], message: str
) -> None:
    client, seen = _recording()
    with pytest.raises(ValidationError) as info:
        call(client)
    assert seen == [], "nothing may be sent"
    error = info.value
    assert isinstance(error, ServiceError) and isinstance(error, ValueError)  # numpy's error was a ValueError
    assert error.status is None and error.request_id is None and message in str(error)
    assert error.errors and error.errors[0]["loc"] == [message.split(":")[0]]


def test_good_input_of_every_numeric_kind_is_sent() -> None:
    client, seen = _recording()
    client.attention(np.ones((1, 2), np.float16), [[1, 2]], [[True]], key_lengths=np.array([1]), scale=np.float32(1))
    assert len(seen) == 1


def test_the_async_client_refuses_the_same_input() -> None:
    async def main() -> None:
        async with AsyncAttentionClient(
            "http://test", transport=httpx.MockTransport(lambda r: httpx.Response(500))
        ) as c:
            with pytest.raises(ValidationError, match="ragged"):
                await c.softmax([[1.0], [1.0, 2.0]])

    asyncio.run(main())


@pytest.mark.parametrize(
    ("given", "url"),
    [
        ("127.0.0.1:8000", "http://127.0.0.1:8000/v1/softmax"),
        ("localhost:9000/prefix", "http://localhost:9000/prefix/v1/softmax"),
        ("https://example.org", "https://example.org/v1/softmax"),
        ("  http://h:1 ", "http://h:1/v1/softmax"),
    ],
)
def test_an_address_without_a_scheme_means_http(given: str, url: str) -> None:
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(str(request.url))
        return httpx.Response(200, json={"probabilities": [1.0], "diagnostics": {}})

    AttentionClient(given, transport=httpx.MockTransport(handler)).softmax([1.0])
    assert seen == [url]


@pytest.mark.parametrize("given", ["ftp://host", "http://", "://x"])
def test_an_unusable_address_is_refused_at_once(given: str) -> None:
    with pytest.raises(ValidationError, match="base_url"):
        AttentionClient(given)
    with pytest.raises(ValidationError, match="base_url"):
        AsyncAttentionClient(given)


def test_ready_is_false_when_nothing_answers() -> None:
    address = f"127.0.0.1:{free_port()}"  # nothing listens there, and no scheme: tritonclient's style
    with AttentionClient(address, timeout=2.0) as client:
        assert client.ready() is False

    async def main() -> bool:
        async with AsyncAttentionClient(address, timeout=2.0) as client:
            return await client.ready()

    assert asyncio.run(main()) is False

    def timeout(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("slow", request=request)

    assert AttentionClient("http://test", transport=httpx.MockTransport(timeout)).ready() is False
    busy = AttentionClient("http://test", transport=httpx.MockTransport(lambda r: httpx.Response(503, json={})))
    assert busy.ready() is False


def test_default_returns_give_the_result_with_those_outputs() -> None:
    client, seen = _recording()
    r = client.attention([[1.0]], [[1.0]], [[1.0, 2.0]])
    assert isinstance(r, DefaultAttentionResult) and r.output.shape == (1, 2) and r.engine.name == "numpy"
    named = client.attention([[1.0]], [[1.0]], [[1.0, 2.0]], returns=["output", "weights", "diagnostics"])
    assert type(named).__name__ == "AttentionResult"
    assert "return" not in httpx.Request("POST", "http://x", content=seen[0].content).read().decode()
    lacking, _ = _recording({"weights": [[1.0]], "engine": ANSWER["engine"]})
    with pytest.raises(ServiceError, match="lacks output, diagnostics"):
        lacking.attention([[1.0]], [[1.0]], [[1.0]])
    grads = {k: [[0.5]] for k in ("grad_query", "grad_key", "grad_value")} | {"engine": ANSWER["engine"]}
    back, _ = _recording(grads)
    assert isinstance(back.attention_backward([[1.0]], [[1.0]], [[1.0]], [[1.0]]), DefaultBackwardResult)


TYPED = """
from typing import assert_type
import numpy as np
import numpy.typing as npt
from typing import Any
from attention_client import AsyncAttentionClient, AttentionClient, AttentionResult, InspectionReport, SampleDiagnostics
from attention_client.results import HeadDiagnostics, HeadInspection, RowValues, TokenLogprob

def sync(c: AttentionClient) -> None:
    r = c.attention([[1.0]], [[1.0]], [[1.0]])
    assert_type(r.output, npt.NDArray[Any])
    assert_type(r.weights, npt.NDArray[Any])
    assert_type(r.diagnostics["heads"][0], HeadDiagnostics)
    assert_type(r.diagnostics["entropy"], RowValues)
    assert_type(r.engine.name, str)
    named = c.attention([[1.0]], [[1.0]], [[1.0]], returns=["output"])
    assert_type(named, AttentionResult)
    assert_type(named.output, npt.NDArray[Any] | None)
    s = c.sample([1.0, 2.0])
    assert_type(s.tokens, npt.NDArray[Any])
    assert_type(s.diagnostics, SampleDiagnostics)
    top = c.sample([1.0], returns=["top_logprobs"]).top_logprobs
    assert_type(top, list[TokenLogprob] | list[list[TokenLogprob]] | None)
    assert_type(c.attention_backward([[1.0]], [[1.0]], [[1.0]], [[1.0]]).grad_key, npt.NDArray[Any])
    assert_type(c.softmax([1.0]).diagnostics["entropy"], RowValues)
    assert_type(c.ready(), bool)
    ins = c.attention([[1.0]], [[1.0]], [[1.0]], returns=["inspection", "norm_weights"], token_ids=[[1]])
    assert_type(ins.inspection, InspectionReport | None)
    assert ins.inspection is not None
    assert_type(ins.inspection["heads"][0], HeadInspection)
    assert_type(ins.inspection["heads"][0]["sink_mass"], float)
    assert_type(ins.norm_weights, npt.NDArray[Any] | None)
    back = c.attention_backward([[1.0]], [[1.0]], [[1.0]], [[1.0]], returns=["head_importance"])
    assert_type(back.head_importance, npt.NDArray[Any] | None)

async def asynchronous(c: AsyncAttentionClient) -> None:
    r = await c.attention([[1.0]], [[1.0]], [[1.0]])
    assert_type(r.output, npt.NDArray[Any])
"""


@pytest.mark.slow
def test_results_are_typed_precisely(tmp_path: Path) -> None:
    """Strict mypy on a user's code: default outputs are arrays, not Optional; diagnostics are TypedDicts."""
    sample = tmp_path / "user_code.py"
    sample.write_text(textwrap.dedent(TYPED))
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(tmp_path / "cache"), str(sample)],
        env={**os.environ, "MYPYPATH": str(CLIENT)},  # the source, however the package is installed
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
