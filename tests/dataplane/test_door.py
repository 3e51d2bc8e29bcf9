"""The data plane's door (issue 29 item 1), in process and without a server: one call admits, reads on the bodies'
lease, checks readiness, counts the statistics, schedules the codec and the operation, and gives everything back,
whatever the answer; each refusal is counted through the observer.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest

from service.dataplane.context import Context
from service.dataplane.door import Call
from service.dataplane.errors import Kind, ServiceError
from service.dataplane.inference import InferRequest, InferResult
from service.dataplane.memory import MemoryLease
from service.dataplane.models import find_model
from service.dataplane.plane import DataPlane
from service.dataplane.scheduling import Job
from service.dataplane.timing import Timing
from service.engines.numpy_engine import NumpyEngine
from service.observability.statistics import ModelTotals
from service.settings import Settings


class Recorder:
    """The plane's observer: what the door and the scheduler report, and the statistics' store."""

    def __init__(self) -> None:
        self.refusals: list[str] = []
        self.ended: list[tuple[str, dict[str, float]]] = []

    def refused(self, reason: str) -> None:
        self.refusals.append(reason)

    def queue_waited(self, seconds: float) -> None: ...

    def admission_changed(self, computing: int, queued: int) -> None: ...

    def engine_ran(self, engine: str, provider: str, model: str, normalizer: str, seconds: float) -> None: ...

    def inference_ended(self, model: str, seconds: Mapping[str, float]) -> None:
        self.ended.append((model, dict(seconds)))

    def inference_totals(self) -> Mapping[str, ModelTotals]:
        return {}


def plane_of(**settings: Any) -> tuple[DataPlane, Recorder]:
    recorder = Recorder()
    plane = DataPlane(Settings(enable_onnx=False, **settings), {"numpy": NumpyEngine()}, observer=recorder)
    plane.runtime.start_engines()
    return plane, recorder


class Echo:
    """A /v1-like operation: the answer is the body, reversed; ``flops`` decides where it runs."""

    name = "echo"

    def __init__(self, flops: float = 0.0) -> None:
        self.flops = flops
        self.threads: list[str] = []

    def prepare(self, ctx: Context, request: bytes, timing: Timing) -> Job[bytes]:
        def run(lease: MemoryLease) -> bytes:
            self.threads.append(threading.current_thread().name)
            return request[::-1]

        return Job(self.flops, 0, 0, run)


class Identity:
    def decode(self, ctx: Context, operation: object, raw: bytes, caller: str) -> bytes:
        return raw

    def encode(self, operation: object, request: bytes, result: bytes) -> bytes:
        return result


def call_of(
    body: bytes,
    operation: Any,
    *,
    declared: int | None = None,
    deadline_s: float | None = None,
    reads: list[int] | None = None,
) -> Call[bytes, bytes, bytes, bytes]:
    async def read(lease: MemoryLease) -> bytes:
        if reads is not None:
            reads.append(lease.held)
        return body

    return Call(
        read=read,
        size=len,
        codec=Identity(),
        operation=operation,
        declared_bytes=len(body) if declared is None else declared,
        deadline_s=deadline_s,
    )


def released(plane: DataPlane) -> bool:
    return plane.admission.admitted == 0 and plane.body_share.reserved == 0 and plane.memory.reserved == 0


def test_one_call_answers_and_gives_everything_back() -> None:
    plane, recorder = plane_of()
    reads: list[int] = []
    assert asyncio.run(plane.door.serve(call_of(b"abc", Echo(), reads=reads))) == b"cba"
    assert reads == [3]  # the declared length was held before the body was read
    assert released(plane) and recorder.refusals == []


def test_an_error_gives_everything_back_too() -> None:
    plane, _ = plane_of()

    class Failing(Echo):
        def prepare(self, ctx: Context, request: bytes, timing: Timing) -> Job[bytes]:
            raise ServiceError(Kind.INVALID, "no")

    with pytest.raises(ServiceError, match="no"):
        asyncio.run(plane.door.serve(call_of(b"abc", Failing())))
    assert released(plane)


def test_cheap_work_runs_on_the_loop_and_costly_work_in_a_worker_thread() -> None:
    plane, _ = plane_of(inline_max_work_flops=1e6)
    cheap, costly = Echo(0.0), Echo(1e9)
    for operation in (cheap, costly):
        asyncio.run(plane.door.serve(call_of(b"x", operation)))
    assert cheap.threads == ["MainThread"] and costly.threads[0] != "MainThread"


def test_a_full_queue_is_refused_and_counted_before_the_body_is_read() -> None:
    plane, recorder = plane_of(max_concurrent_requests=1, max_queued_requests=0)
    plane.admission.admit()  # one request computing, no room to queue
    reads: list[int] = []
    with pytest.raises(ServiceError) as err:
        asyncio.run(plane.door.serve(call_of(b"abc", Echo(), reads=reads)))
    assert err.value.kind is Kind.UNAVAILABLE and err.value.retry_after_s is not None
    assert "the server is at capacity" in err.value.message
    assert reads == [] and recorder.refusals == ["queue_full"]
    plane.admission.leave()
    assert released(plane)


def test_a_deadline_shorter_than_the_expected_wait_is_refused_at_once() -> None:
    plane, recorder = plane_of(max_concurrent_requests=1, max_queued_requests=8)
    plane.admission.admit()
    plane.admission.service_s = 2.0  # the one ahead holds its slot about 2 s
    with pytest.raises(ServiceError) as err:
        asyncio.run(plane.door.serve(call_of(b"abc", Echo(), deadline_s=0.5)))
    assert err.value.kind is Kind.TIMEOUT and "longer than the call's deadline (0.50 s)" in err.value.message
    assert recorder.refusals == ["deadline"]
    plane.admission.leave()
    assert released(plane)


def test_a_body_the_share_cannot_hold_is_refused_unread() -> None:
    plane, recorder = plane_of(body_memory_bytes=1 << 20, max_body_bytes=1 << 20)
    reads: list[int] = []
    with pytest.raises(ServiceError) as err:
        asyncio.run(plane.door.serve(call_of(b"abc", Echo(), declared=2 << 20, reads=reads)))
    assert err.value.kind is Kind.UNAVAILABLE and "request bodies hold" in err.value.message
    assert reads == [] and recorder.refusals == ["body_memory"]
    assert released(plane)


def test_a_model_not_ready_is_refused_before_its_body_is_read() -> None:
    recorder = Recorder()
    plane = DataPlane(Settings(enable_onnx=False), {"numpy": NumpyEngine()}, observer=recorder)  # not started
    reads: list[int] = []
    with pytest.raises(ServiceError) as err:
        asyncio.run(plane.door.serve(call_of(b"abc", find_model("attention"), reads=reads)))
    assert err.value.kind is Kind.UNAVAILABLE and err.value.message.startswith("model 'attention' is not ready")
    assert reads == [] and released(plane)


class Tensors:
    """A codec of already-decoded arrays: what a front end's codec gives the door, without a wire form."""

    def decode(self, ctx: Context, operation: object, raw: dict[str, Any], caller: str) -> InferRequest:
        parameters = raw.pop("parameters", {})
        return InferRequest(None, parameters, raw, {name: "FP64" for name in raw})

    def encode(self, operation: object, request: InferRequest, result: InferResult) -> dict[str, np.ndarray]:
        return dict(result.outputs)


def test_a_models_requests_are_counted_in_the_statistics_success_or_fail() -> None:
    plane, recorder = plane_of()
    q = np.eye(2)

    def call(arrays: dict[str, Any]) -> Call[Any, Any, Any, Any]:
        async def read(lease: MemoryLease) -> dict[str, Any]:
            return dict(arrays)

        return Call(read=read, size=lambda raw: 64, codec=Tensors(), operation=find_model("attention"))

    out = asyncio.run(plane.door.serve(call({"query": q, "key": q, "value": q})))
    np.testing.assert_allclose(out["output"], [[0.6697615493266569, 0.3302384506733431], [0.33023845, 0.66976155]])
    with pytest.raises(ServiceError):
        asyncio.run(plane.door.serve(call({"query": q, "key": q, "value": q, "parameters": {"temperature": -1.0}})))
    assert [(model, sorted(s)) for model, s in recorder.ended] == [
        ("attention", ["compute_infer", "compute_input", "compute_output", "queue", "success"]),
        ("attention", ["fail"]),
    ]
    assert released(plane)


def test_the_message_names_the_model_when_the_route_does_not() -> None:
    plane, _ = plane_of()

    async def read(lease: MemoryLease) -> bytes:
        return b"nope"

    call: Call[bytes, bytes, bytes, bytes] = Call(
        read=read, size=len, codec=Identity(), named_by=lambda raw: find_model(raw.decode())
    )
    with pytest.raises(ServiceError) as err:
        asyncio.run(plane.door.serve(call))
    assert err.value.kind is Kind.NOT_FOUND and "unknown model 'nope'" in err.value.message
    assert released(plane)
