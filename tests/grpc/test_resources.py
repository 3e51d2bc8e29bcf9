"""The resource guarantees REST keeps, over gRPC, on live servers (issue 21, "Edges III"): messages held on the
memory budget's share for request bodies (one share with REST bodies), a cap on concurrent calls, and calls cut
off by the shutdown grace answered UNAVAILABLE with a retry-after, without a traceback.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import orjson
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from service.grpc.generated import inference_pb2 as pb
from service.grpc.generated import inference_pb2_grpc as pb_grpc
from tests.e2e.conftest import free_port
from tests.grpc.conftest import wait_serving
from tests.hardening.conftest import LiveServer, metric_value, settled_rss_kb, status_kb, wait_admitted

pytestmark = pytest.mark.slow  # each test starts a live server

MIB = 1 << 20
SHAPE = (192, 16384)  # 12 MiB of float32 logits
CHANNEL_OPTIONS = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]


class Server(LiveServer):
    """``python -m service serve`` with gRPC on a known port (``target``) and its log (``log()``)."""

    def __init__(self, env: dict[str, str], tmp_path: Path) -> None:
        grpc_port = free_port()
        super().__init__({"ATTN_GRPC_PORT": str(grpc_port), **env}, tmp_path)
        self.target = f"127.0.0.1:{grpc_port}"


@pytest.fixture
def live_grpc(tmp_path: Path) -> Iterator[Callable[..., Server]]:
    """A factory: ``live_grpc(**env)`` starts a server and waits until REST is ready and gRPC answers."""
    servers: list[Server] = []

    def start(**env: str) -> Server:
        server = Server(env, tmp_path)
        servers.append(server)
        server.wait_ready()
        wait_serving(server.target)
        return server

    yield start
    for server in servers:
        server.close()


def softmax_request(shape: tuple[int, ...] = SHAPE, name: str = "logits") -> pb.ModelInferRequest:
    """A softmax call with raw float32 logits of ``shape`` (``name``: a wrong one makes it INVALID_ARGUMENT)."""
    request = pb.ModelInferRequest(model_name="softmax")
    request.inputs.add(name=name, datatype="FP32", shape=list(shape))
    request.raw_input_contents.append(np.zeros(shape, dtype="<f4").tobytes())
    return request


def infer(
    target: str, request: pb.ModelInferRequest, rid: str = "", key: str = ""
) -> tuple[grpc.StatusCode, str, dict[str, str]]:
    """The call's status, message and trailing metadata (``rid``: its request id; ``key``: its API key)."""
    metadata = ((("x-request-id", rid),) if rid else ()) + ((("x-api-key", key),) if key else ())
    with grpc.insecure_channel(target, options=CHANNEL_OPTIONS) as channel:
        try:
            pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, metadata=metadata or None, timeout=60)
        except grpc.RpcError as err:
            return err.code(), err.details() or "", dict(err.trailing_metadata() or ())
    return grpc.StatusCode.OK, "", {}


def in_background(fn: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    """``fn`` in a thread of its own; its result in the list once it ends."""
    result: list[Any] = []
    thread = threading.Thread(target=lambda: result.append(fn()))
    thread.start()
    return thread, result


def rest_softmax(url: str, shape: tuple[int, ...] = SHAPE) -> httpx.Response:
    """The same softmax over REST (/v2, binary logits)."""
    logits = np.zeros(shape, dtype="<f4").tobytes()
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "logits",
                    "shape": list(shape),
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": len(logits)},
                }
            ],
            "outputs": [{"name": "probabilities", "parameters": {"binary_data": True}}],
        }
    )
    headers = {"inference-header-content-length": str(len(header)), "content-type": "application/octet-stream"}
    return httpx.post(f"{url}/v2/models/softmax/infer", content=header + logits, headers=headers, timeout=60)


def test_messages_hold_the_bodies_share_with_rest_bodies(live_grpc: Callable[..., Server]) -> None:
    """A 12 MiB message holds 12 of the bodies' 16 MiB until its call ends: a second message, or a REST body,
    finds no room (UNAVAILABLE / 503, REST's words, a retry-after); and a REST body holds the same share.
    """
    server = live_grpc(
        ATTN_MEMORY_BUDGET_BYTES=str(128 * MIB),
        ATTN_MAX_BODY_BYTES=str(16 * MIB),
        ATTN_BODY_MEMORY_BYTES=str(16 * MIB),
        ATTN_DEBUG_DELAY_S="3",
    )
    holder, held = in_background(lambda: infer(server.target, softmax_request()))
    wait_admitted(server.url)  # the first call holds its message on the share, and its compute slot for 3 s
    code, message, trailers = infer(server.target, softmax_request())
    assert code == grpc.StatusCode.UNAVAILABLE, (code, message)
    assert message.startswith("the server's memory is in use: request bodies hold 12.0 MiB of the 16.0 MiB"), message
    assert int(trailers["retry-after"]) >= 1
    rest = rest_softmax(server.url)  # the share is REST's as well
    assert rest.status_code == 503 and "request bodies hold 12.0 MiB" in rest.text, rest.text
    holder.join(30)
    assert held == [(grpc.StatusCode.OK, "", {})]
    # Now a REST body holds the share: a gRPC message finds no room.
    holder, rest_held = in_background(lambda: rest_softmax(server.url))
    wait_admitted(server.url)
    code, message, _ = infer(server.target, softmax_request())
    assert code == grpc.StatusCode.UNAVAILABLE and "request bodies hold 12.0 MiB" in message, (code, message)
    holder.join(30)
    assert rest_held[0].status_code == 200, rest_held[0].text
    text = httpx.get(server.url + "/metrics").text
    assert metric_value(text, "attn_http_requests_rejected_total", reason="body_memory") == 3
    assert infer(server.target, softmax_request())[0] == grpc.StatusCode.OK  # everything was given back


def test_a_message_is_given_back_whatever_the_answer(live_grpc: Callable[..., Server]) -> None:
    """Refused calls (INVALID_ARGUMENT, NOT_FOUND, UNAVAILABLE) release their message: no room is lost."""
    server = live_grpc(
        ATTN_MEMORY_BUDGET_BYTES=str(128 * MIB),
        ATTN_MAX_BODY_BYTES=str(16 * MIB),
        ATTN_BODY_MEMORY_BYTES=str(16 * MIB),
    )
    for _ in range(3):
        assert infer(server.target, softmax_request(name="nope"))[0] == grpc.StatusCode.INVALID_ARGUMENT
    wrong_model = softmax_request()
    wrong_model.model_name = "nope"
    assert infer(server.target, wrong_model)[0] == grpc.StatusCode.NOT_FOUND
    assert infer(server.target, softmax_request())[0] == grpc.StatusCode.OK
    text = httpx.get(server.url + "/metrics").text
    assert metric_value(text, "attn_http_requests_rejected_total", reason="body_memory") == 0


def test_refused_large_messages_leave_no_memory_behind(live_grpc: Callable[..., Server]) -> None:
    """Eight concurrent 29 MiB messages refused on their estimate: the worker's resident memory comes back near its
    idle size (it stayed 630-730 MiB above it; with the heap trimmed after each, 75-170 MiB, what gRPC frees
    after the last trim: the connections' buffers).
    """
    server = live_grpc()
    shape = (1, 16, 10000, 16)
    request = pb.ModelInferRequest(model_name="attention")
    rng = np.random.default_rng(0)
    for name in ("query", "key", "value"):
        request.inputs.add(name=name, datatype="FP32", shape=list(shape))
        request.raw_input_contents.append(rng.standard_normal(shape).astype("<f4").tobytes())
    request.outputs.add(name="weights")  # 6.4 GB of weights: over the memory budget
    assert request.ByteSize() > 29 * MIB
    httpx.get(server.url + "/healthz")
    idle = status_kb(server.proc.pid, "VmRSS") * 1024
    calls = [in_background(lambda: infer(server.target, request)) for _ in range(8)]
    for thread, result in calls:
        thread.join(60)
        assert result[0][0] == grpc.StatusCode.RESOURCE_EXHAUSTED, result
    after = settled_rss_kb(server.proc.pid, below_kb=(idle + 300 * MIB) / 1024) * 1024  # the trim: its own thread
    assert after - idle < 300 * MIB, ((after - idle) / MIB, idle / MIB)


def test_calls_past_the_cap_are_resource_exhausted(live_grpc: Callable[..., Server]) -> None:
    server = live_grpc(ATTN_GRPC_MAX_CONCURRENT_RPCS="2", ATTN_DEBUG_DELAY_S="2")
    small = softmax_request((4,))
    holders = [in_background(lambda: infer(server.target, small)) for _ in range(2)]
    wait_admitted(server.url, 2)  # two calls in flight, each 2 s
    code, message, _ = infer(server.target, softmax_request())
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, (code, message)
    for thread, result in holders:
        thread.join(30)
        assert result == [(grpc.StatusCode.OK, "", {})]
    with grpc.insecure_channel(server.target) as channel:  # healthy again
        health = health_pb2_grpc.HealthStub(channel)
        assert health.Check(health_pb2.HealthCheckRequest()).status == health_pb2.HealthCheckResponse.SERVING
    assert infer(server.target, small)[0] == grpc.StatusCode.OK
    assert "Traceback" not in server.log()


def test_calls_cut_off_by_the_shutdown_grace_are_unavailable(live_grpc: Callable[..., Server]) -> None:
    server = live_grpc(ATTN_DEBUG_DELAY_S="30", ATTN_REQUEST_TIMEOUT_S="60", ATTN_SHUTDOWN_GRACE_S="1")
    small = softmax_request((4,))
    calls = [in_background(lambda i=i: infer(server.target, small, rid=f"cut-{i}")) for i in range(6)]
    wait_admitted(server.url, 6)  # all six in flight: two holding the compute slots, four waiting for one
    t0 = time.monotonic()
    server.terminate()
    assert server.proc.wait(30) == 0, server.log()
    assert time.monotonic() - t0 < 10
    for thread, result in calls:
        thread.join(30)
        code, message, trailers = result[0]
        assert code in (grpc.StatusCode.OK, grpc.StatusCode.UNAVAILABLE), (code, message)
        if code == grpc.StatusCode.UNAVAILABLE:
            assert "shutting down" in message and "ATTN_SHUTDOWN_GRACE_S" in message, message
            assert int(trailers["retry-after"]) >= 1
    log = server.log()
    assert "Traceback" not in log and "CancelledError" not in log, log
    access = [orjson.loads(line) for line in log.splitlines() if '"message":"request"' in line and "cut-" in line]
    assert sorted(a["status"] for a in access) == ["UNAVAILABLE"] * 6, access
