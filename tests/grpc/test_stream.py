"""``ModelStreamInfer`` (issue 30 item 5) with tritonclient.grpc's stream against live servers: each request on a
stream answered in order with what ``ModelInfer`` answers for it, a refused one with Triton's per-message
``error_message`` while the stream goes on, every model, the API key checked before any message is read, the
inference calls' cap held while the stream is open, and its end (the server stopping, a pause past the message
deadline, a message over the size limit, the call's deadline). It used to be ``UNIMPLEMENTED``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import queue
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import grpc
import httpx
import numpy as np
import orjson
import pytest
import tritonclient.grpc as tg
from grpc import aio
from tritonclient.utils import InferenceServerException

from service.dataplane.plane import DataPlane
from service.engines.numpy_engine import NumpyEngine
from service.grpc import stream as stream_module
from service.grpc.generated import inference_pb2 as pb
from service.grpc.server import GrpcServer as InProcessServer
from service.observability.metrics import ServiceMetrics
from service.settings import Settings
from tests.grpc.conftest import API_KEY, GrpcServer
from tests.grpc.test_resources import Server, infer, live_grpc, softmax_request
from tests.grpc.test_tritonclient import grpc_inputs
from tests.hardening.conftest import metric_value

__all__ = ["live_grpc"]  # the fixture, imported so that these tests can use it

pytestmark = pytest.mark.slow  # live servers

ROUTE = "/inference.GRPCInferenceService/ModelStreamInfer"
RNG = np.random.default_rng(30)
Answer = tuple[Any, InferenceServerException | None]


class Stream:
    """A tritonclient.grpc stream and the answers its callback has received, in order."""

    def __init__(self, target: str, **kwargs: Any) -> None:
        self.client = tg.InferenceServerClient(target)
        self.answers: queue.Queue[Answer] = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.answers.put((result, error)), **kwargs)

    def send(self, model: str, arrays: dict[str, np.ndarray], outputs: Sequence[str] = (), **kwargs: Any) -> None:
        wanted = [tg.InferRequestedOutput(name) for name in outputs] or None
        self.client.async_stream_infer(model, grpc_inputs(arrays), outputs=wanted, **kwargs)

    def next(self, timeout: float = 30) -> Answer:
        return self.answers.get(timeout=timeout)

    def close(self) -> None:
        self.client.stop_stream()  # once stopped, another stop does nothing


@pytest.fixture
def streams() -> Iterator[Callable[..., Stream]]:
    """A factory of streams, each closed at the end of the test."""
    opened: list[Stream] = []

    def open_stream(target: str, **kwargs: Any) -> Stream:
        opened.append(Stream(target, **kwargs))
        return opened[-1]

    yield open_stream
    for stream in opened:
        stream.close()
        stream.client.close()


def qkv(shape: tuple[int, ...], dtype: type = np.float32) -> dict[str, np.ndarray]:
    return {name: RNG.standard_normal(shape).astype(dtype) for name in ("query", "key", "value")}


def every_model() -> list[tuple[str, dict[str, np.ndarray], list[str], dict[str, Any]]]:
    """A request of each model: its name, inputs, outputs and parameters."""
    logits = RNG.standard_normal((3, 50)).astype(np.float32)
    backward = qkv((1, 2, 4, 8), np.float64)
    backward["grad_output"] = RNG.standard_normal((1, 2, 4, 8))
    masked = qkv((2, 2, 5, 8))
    masked["mask"] = RNG.random((2, 1, 5, 5)) > 0.3
    return [
        ("attention", masked, ["output", "weights"], {"causal": "bottom_right", "temperature": 0.7}),
        ("softmax", {"logits": logits}, ["probabilities", "log_probabilities"], {"temperature": 1.7}),
        (
            "sample",
            {"logits": logits, "previous_tokens": np.array([[1, 2], [4, -1], [0, 0]], dtype=np.int64)},
            ["tokens", "logprobs"],
            {"seed": 11, "n": 4, "top_k": 10, "repetition_penalty": 1.3},
        ),
        (
            "calibrate",
            {"logits": logits.astype(np.float64), "labels": RNG.integers(0, 50, 3).astype(np.int64)},
            ["temperature", "ece"],
            {},
        ),
        ("attention_backward", backward, ["grad_query", "grad_key", "grad_value"], {"grad_scale": True}),
    ]


def unary(target: str, model: str, arrays: dict[str, np.ndarray], outputs: list[str], **parameters: Any) -> Any:
    client = tg.InferenceServerClient(target)
    wanted = [tg.InferRequestedOutput(name) for name in outputs]
    return client.infer(model, grpc_inputs(arrays), outputs=wanted, parameters=parameters)


def unary_refusal(target: str, model: str, arrays: dict[str, np.ndarray], **parameters: Any) -> str:
    with pytest.raises(InferenceServerException) as err:
        tg.InferenceServerClient(target).infer(model, grpc_inputs(arrays), parameters=parameters)
    return str(err.value.message())


def assert_equal_outputs(streamed: Any, answered: Any, outputs: list[str]) -> None:
    for name in outputs:
        a, b = streamed.as_numpy(name), answered.as_numpy(name)
        assert a.dtype == b.dtype and a.shape == b.shape, name
        np.testing.assert_array_equal(a, b, err_msg=name)


def raw_stream(
    target: str, messages: Iterator[bytes], metadata: tuple[tuple[str, str], ...] = (), timeout: float = 30
) -> tuple[list[pb.ModelStreamInferResponse], grpc.StatusCode, str, dict[str, str]]:
    """The answers of a stream that sends ``messages`` (serialized, or not), its status, details and trailers."""
    answers: list[pb.ModelStreamInferResponse] = []
    with grpc.insecure_channel(target) as channel:
        call = channel.stream_stream(ROUTE, request_serializer=None, response_deserializer=None)
        responses = call(messages, metadata=metadata or None, timeout=timeout)
        try:
            for raw in responses:
                answers.append(pb.ModelStreamInferResponse.FromString(raw))
        except grpc.RpcError as err:
            return answers, err.code(), err.details() or "", dict(err.trailing_metadata() or ())
        return answers, responses.code(), responses.details() or "", dict(responses.trailing_metadata() or ())


def test_several_requests_on_one_stream_are_answered_in_order_as_model_infer_answers(
    server: GrpcServer, streams: Callable[..., Stream]
) -> None:
    stream = streams(server.target)
    requests = [(qkv((1, 2, 3 + i, 8)), {"temperature": 0.5 + i, "normalizer": "entmax15"}) for i in range(5)]
    for i, (arrays, parameters) in enumerate(requests):
        stream.send("attention", arrays, ["output", "weights"], request_id=f"req-{i}", parameters=parameters)
    for i, (arrays, parameters) in enumerate(requests):
        result, error = stream.next()
        assert error is None, error
        assert result.get_response().id == f"req-{i}" and result.get_response().model_name == "attention"
        assert result.as_numpy("output").shape == (1, 2, 3 + i, 8)  # in the order sent
        answered = unary(server.target, "attention", arrays, ["output", "weights"], **parameters)
        assert_equal_outputs(result, answered, ["output", "weights"])


def test_every_model_answers_on_one_stream_as_model_infer(server: GrpcServer, streams: Callable[..., Stream]) -> None:
    stream = streams(server.target)
    cases = every_model()
    for model, arrays, outputs, parameters in cases:
        stream.send(model, arrays, outputs, request_id=model, parameters=parameters)
    for model, arrays, outputs, parameters in cases:
        result, error = stream.next()
        assert error is None, (model, error.message() if error else None)
        assert result.get_response().id == model
        assert_equal_outputs(result, unary(server.target, model, arrays, outputs, **parameters), outputs)


def test_a_refused_request_gets_its_error_and_the_stream_goes_on(
    server: GrpcServer, streams: Callable[..., Stream]
) -> None:
    """Triton's per-message form: ``error_message`` with the words ModelInfer's status carries (REST's), the stream
    still open for the next request.
    """
    stream = streams(server.target)
    good = qkv((1, 1, 4, 4))
    refused: list[tuple[str, dict[str, np.ndarray], dict[str, Any]]] = [
        ("attention", {"query": good["query"]}, {}),  # inputs missing
        ("attention", good, {"temprature": 2.0}),  # a parameter the model does not have
        ("nope", good, {}),  # no such model
    ]
    stream.send("attention", good, ["output"], request_id="first")
    for i, (model, arrays, parameters) in enumerate(refused):
        stream.send(model, arrays, request_id=f"refused-{i}", parameters=parameters)
    stream.send("attention", good, ["output"], request_id="last")
    first, error = stream.next()
    assert error is None and first.get_response().id == "first"
    for model, arrays, parameters in refused:
        result, error = stream.next()
        assert result is None and error is not None
        assert error.message() == unary_refusal(server.target, model, arrays, **parameters)
    assert "needs input 'key', 'value'" in unary_refusal(server.target, "attention", {"query": good["query"]})
    last, error = stream.next()
    assert error is None and last.get_response().id == "last"
    np.testing.assert_array_equal(last.as_numpy("output"), first.as_numpy("output"))


def test_the_error_form_carries_the_request_id_and_an_undecodable_message_is_refused_too(server: GrpcServer) -> None:
    good = softmax_request((4,))
    good.id = "good"
    bad = softmax_request((4,), name="nope")
    bad.id = "bad-7"
    messages = iter([bad.SerializeToString(), b"\xff\xff\xff", good.SerializeToString()])
    answers, code, details, trailers = raw_stream(server.target, messages, (("x-request-id", "stream-rid-1"),))
    assert code == grpc.StatusCode.OK, details
    assert trailers["x-request-id"] == "stream-rid-1"
    assert [a.HasField("infer_response") for a in answers] == [True, True, True]
    refused, undecodable, answered = answers
    assert refused.error_message == infer(server.target, bad)[1] and "'nope'" in refused.error_message
    assert refused.infer_response.id == "bad-7" and not refused.infer_response.outputs
    assert undecodable.error_message == "the request is not a valid protobuf message of this method"
    assert not answered.error_message and answered.infer_response.id == "good"
    assert answered.infer_response.outputs[0].name == "probabilities"


def test_a_stream_without_the_key_is_refused_before_any_message_is_read(
    keyed_server: GrpcServer, streams: Callable[..., Stream]
) -> None:
    never = threading.Event()

    def silent() -> Iterator[bytes]:  # headers sent, no message ever
        never.wait(30)
        return
        yield b""  # pragma: no cover

    t0 = time.monotonic()
    answers, code, details, _ = raw_stream(keyed_server.target, silent())
    assert code == grpc.StatusCode.UNAUTHENTICATED and "needs an API key" in details, (code, details)
    assert answers == [] and time.monotonic() - t0 < 2.0  # at once: nothing read, no place held
    never.set()
    stream = streams(keyed_server.target)
    with contextlib.suppress(InferenceServerException):  # refused as its headers arrive: it may have ended already
        stream.send("softmax", {"logits": np.ones((1, 4), dtype=np.float32)})
    result, error = stream.next()
    assert result is None and error is not None and error.status() == "StatusCode.UNAUTHENTICATED"
    keyed = streams(keyed_server.target, headers={"x-api-key": API_KEY})
    keyed.send("softmax", {"logits": np.ones((1, 4), dtype=np.float32)}, ["probabilities"])
    result, error = keyed.next()
    assert error is None and result.as_numpy("probabilities").shape == (1, 4)


def test_the_calls_deadline_bounds_the_whole_stream(server: GrpcServer, streams: Callable[..., Stream]) -> None:
    stream = streams(server.target, stream_timeout=1.5)
    stream.send("softmax", {"logits": np.ones((1, 4), dtype=np.float32)}, request_id="in-time")
    result, error = stream.next()
    assert error is None and result.get_response().id == "in-time"
    result, error = stream.next(timeout=10)  # nothing more sent: the deadline ends the stream
    assert result is None and error is not None and error.status() == "StatusCode.DEADLINE_EXCEEDED"


def test_a_stream_holds_an_inference_place_while_open_and_its_limits(
    live_grpc: Callable[..., Server], streams: Callable[..., Stream]
) -> None:
    """One inference call at a time: an open stream takes the place (a ModelInfer is refused RESOURCE_EXHAUSTED),
    closed it gives it back; a pause past ATTN_BODY_TIMEOUT_S ends a stream DEADLINE_EXCEEDED, a message over
    the size limit RESOURCE_EXHAUSTED naming the limit (as a ModelInfer's); the stream and each message answered
    are in the access log and the metrics.
    """
    server = live_grpc(
        ATTN_GRPC_MAX_CONCURRENT_RPCS="1",
        ATTN_BODY_TIMEOUT_S="3",
        ATTN_MAX_BODY_BYTES=str(1 << 20),
        ATTN_LOG_LEVEL="info",
    )
    small = {"logits": np.ones((1, 4), dtype=np.float32)}
    stream = streams(server.target, headers={"x-request-id": "held-stream"})
    stream.send("softmax", small, request_id="one")
    stream.send("softmax", {"nope": small["logits"]}, request_id="two")
    assert stream.next()[1] is None and stream.next()[1] is not None
    code, message, _ = infer(server.target, softmax_request((4,)))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "ATTN_GRPC_MAX_CONCURRENT_RPCS" in message, message
    stream.close()
    assert infer(server.target, softmax_request((4,)))[0] == grpc.StatusCode.OK  # the place given back

    idle = streams(server.target)
    idle.send("softmax", small, request_id="before-the-pause")
    assert idle.next()[1] is None
    t0 = time.monotonic()
    result, error = idle.next(timeout=15)
    assert error is not None and error.status() == "StatusCode.DEADLINE_EXCEEDED", error
    assert "next request message did not arrive within 3 s (ATTN_BODY_TIMEOUT_S)" in error.message()
    assert 2.0 < time.monotonic() - t0 < 8.0

    large = streams(server.target)
    large.send("softmax", small, request_id="fits")
    large.send("softmax", {"logits": np.zeros((1, 300_000), dtype=np.float32)})  # 1.2 MB, over 1 MiB
    assert large.next()[1] is None
    result, error = large.next()
    assert error is not None and error.status() == "StatusCode.RESOURCE_EXHAUSTED", error
    assert str(1 << 20) in error.message()

    metrics = httpx.get(server.url + "/metrics").text
    count = metric_value(
        metrics, "attn_http_requests_total", protocol="grpc", route=ROUTE, model="softmax", status="OK"
    )
    assert count >= 1
    assert metric_value(metrics, "attn_http_requests_rejected_total", reason="message_timeout") == 1
    lines = [orjson.loads(line) for line in server.log().splitlines() if line.startswith("{")]
    held = [line for line in lines if line.get("request_id") == "held-stream"]
    assert [(line["message"], line["status"]) for line in held] == [
        ("stream message", "OK"),
        ("stream message", "INVALID_ARGUMENT"),
        ("request", "OK"),
    ]
    assert all(line["path"] == ROUTE and line["protocol"] == "grpc" for line in held)


def test_a_stopping_server_ends_its_streams_at_once_with_retry_after(live_grpc: Callable[..., Server]) -> None:
    """SIGTERM: a stream waiting for its next message ends at once, UNAVAILABLE with retry-after (not at the end
    of the shutdown grace), after the answers to the messages it had taken.
    """
    server = live_grpc(ATTN_SHUTDOWN_GRACE_S="20")
    sent = threading.Event()
    never = threading.Event()
    request = softmax_request((4,))
    request.id = "before-the-stop"

    def messages() -> Iterator[bytes]:
        yield request.SerializeToString()
        sent.set()
        never.wait(30)

    result: list[Any] = []
    caller = threading.Thread(target=lambda: result.append(raw_stream(server.target, messages())))
    caller.start()
    assert sent.wait(10)
    time.sleep(0.5)  # answered, and waiting for the next message
    t0 = time.monotonic()
    os.kill(server.proc.pid, signal.SIGTERM)
    caller.join(15)
    never.set()
    answers, code, details, trailers = result[0]
    assert time.monotonic() - t0 < 5.0
    assert [a.infer_response.id for a in answers] == ["before-the-stop"]
    assert code == grpc.StatusCode.UNAVAILABLE and "the server is stopping" in details, (code, details)
    assert int(trailers["retry-after"]) >= 1
    assert server.proc.wait(15) == 0
    assert "Traceback" not in server.log()


def test_what_a_stream_runs_at_its_end_runs_once_however_it_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    """The seam for what a stream holds (sequences): a callable registered on the call's Stream runs once when the
    client half-closes, when it cancels, and when the server stops, in process.
    """
    ended: list[str] = []

    class Recorded(stream_module.Stream):
        def __init__(self) -> None:
            super().__init__()
            self.on_end(lambda: ended.append("ended"))

    monkeypatch.setattr(stream_module, "Stream", Recorded)
    plane = DataPlane(Settings(enable_onnx=False, grpc_port=0), {"numpy": NumpyEngine(threads=1)})
    plane.runtime.start_engines()
    request = softmax_request((4,))

    async def until(count: int) -> list[str]:
        for _ in range(200):
            if len(ended) >= count:
                break
            await asyncio.sleep(0.01)
        return list(ended)

    async def scenario() -> tuple[list[list[str]], grpc.StatusCode]:
        server = InProcessServer(plane, ServiceMetrics())
        port = await server.start()
        seen = []
        async with aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            method = channel.stream_stream(
                ROUTE,
                request_serializer=pb.ModelInferRequest.SerializeToString,
                response_deserializer=pb.ModelStreamInferResponse.FromString,
            )
            closed = method()
            await closed.write(request)
            assert not (await closed.read()).error_message
            await closed.done_writing()
            assert await closed.code() == grpc.StatusCode.OK
            seen.append(await until(1))
            cancelled = method()
            await cancelled.write(request)
            await cancelled.read()
            cancelled.cancel()
            seen.append(await until(2))
            stopped = method()
            await stopped.write(request)
            await stopped.read()
            await server.stop(5.0)
            seen.append(await until(3))
            return seen, await stopped.code()

    seen, code = asyncio.run(scenario())
    assert seen == [["ended"], ["ended"] * 2, ["ended"] * 3] and code == grpc.StatusCode.UNAVAILABLE


def test_a_stream_runs_each_registered_callable_once_even_when_one_fails(caplog: pytest.LogCaptureFixture) -> None:
    stream = stream_module.Stream()
    ran: list[int] = []
    stream.on_end(lambda: ran.append(1))
    stream.on_end(lambda: 1 / 0)  # type: ignore[func-returns-value]
    stream.on_end(lambda: ran.append(3))
    with caplog.at_level(logging.ERROR, logger="service.errors"):
        stream.end()
        stream.end()
    assert ran == [1, 3] and "a callable registered to run at the end of a stream failed" in caplog.text
    stream.on_end(lambda: ran.append(4))  # registered once ended: runs at once
    assert ran == [1, 3, 4]
