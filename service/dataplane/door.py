"""The door: the one call through which a request that does work enters the data plane, from either front end.

A front end reads what is its own (the key and the declared size from headers or metadata, the call's
deadline), hands the door a :class:`Call` and awaits the answer in its own wire form, or a
:class:`~service.dataplane.errors.ServiceError` that it maps to its statuses. The door, in order:

1. **admission**: a place among the requests taken (``UNAVAILABLE`` with a retry-after when the queue is full or
   its expected wait too long; ``TIMEOUT`` at once when the expected wait for a compute slot is longer than the
   call's own deadline);
2. **the body's lease** on the bodies' share of the memory budget (``ATTN_BODY_MEMORY_BYTES``, one share for REST
   bodies and gRPC messages): the declared size at once, then what the front end's reader holds as the bytes
   arrive (``UNAVAILABLE`` when there is no room: it does not wait); held until the request ends;
3. the request's bytes, read by the front end on that lease (:attr:`Call.read`);
4. **the operation**: the model's readiness (``NOT_FOUND``, ``UNAVAILABLE``) and, for the protocol's models, the
   statistics (:mod:`.statistics`); then ``ATTN_DEBUG_DELAY_S`` (tests: slow work that holds a compute slot);
5. **scheduling** (:mod:`.scheduling`): on the event loop when cheap, else in a worker thread holding a compute
   slot; there the front end's codec decodes the bytes (a large body is parsed in the worker), the operation
   runs, and the codec encodes its answer;
6. **the end**, whatever the answer: the admission place and the lease given back, the C heap's free memory given
   back after a large body (the plane's :class:`~.heap.HeapTrimmer`).

Refusals are counted through the plane's observer. Which requests pass the door, alike on both protocols: the
operations that hold a body and compute (REST ``POST /v1/...`` and ``POST /v2/models/{name}[/versions/1]/infer``,
gRPC ``ModelInfer``). Health, readiness, metadata, statistics, metrics, docs and pages are answered without
admission on both: they are cheap, and a client of an overloaded server must still learn its state.

The codec is the front end's (:class:`Codec`: its wire form of the operation's request and answer); the
operation is the data plane's (:class:`Operation`: a model of the protocol, or a /v1 operation). The scheduler
runs the job the door composes of them; it calls nothing of a front end's but its codec.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from service.dataplane.admission import Admission, Overloaded
from service.dataplane.context import NOT_READY_RETRY_AFTER_S, Context
from service.dataplane.errors import Kind, ServiceError, unavailable
from service.dataplane.heap import HeapTrimmer
from service.dataplane.memory import BudgetShare, MemoryLease
from service.dataplane.models import Model
from service.dataplane.runtime import Runtime
from service.dataplane.scheduling import Job, Scheduler, SchedulerObserver
from service.dataplane.statistics import InferenceStatistics
from service.dataplane.timing import Timing

Raw = TypeVar("Raw")
Req = TypeVar("Req")
Res = TypeVar("Res")
Out = TypeVar("Out")
Raw_contra = TypeVar("Raw_contra", contravariant=True)
Req_contra = TypeVar("Req_contra", contravariant=True)
Res_contra = TypeVar("Res_contra", contravariant=True)
Out_co = TypeVar("Out_co", covariant=True)


class Operation(Protocol[Req_contra, Res]):
    """What a request asks of the data plane: a model of the protocol (:class:`~.models.Model`) or a /v1
    operation. ``prepare`` checks a decoded request and estimates its work; the job it returns computes.
    """

    @property
    def name(self) -> str: ...

    def prepare(self, ctx: Context, request: Req_contra, timing: Timing) -> Job[Res]: ...


class Codec(Protocol[Raw_contra, Req, Res_contra, Out_co]):
    """A front end's wire form of an operation: the request's bytes decoded (and checked as they are), the
    operation's answer encoded. Both run where the job runs (a worker thread for a large request).
    """

    def decode(self, ctx: Context, operation: object, raw: Raw_contra, caller: str) -> Req: ...

    def encode(self, operation: object, request: Req, result: Res_contra) -> Out_co: ...


@dataclass(frozen=True, slots=True)
class Call(Generic[Raw, Req, Res, Out]):
    """One request as a front end hands it to the door."""

    read: Callable[[MemoryLease], Awaitable[Raw]]
    """Reads the request's bytes (a body, a message), holding them on the lease as they arrive (beyond
    ``declared_bytes``, which the door reserves first)."""
    size: Callable[[Raw], int]
    """The size of what was read, in bytes."""
    codec: Codec[Raw, Req, Res, Out]
    operation: Operation[Req, Res] | None = None
    """What the request asks, when the front end knows it before reading (REST: from its route)."""
    named_by: Callable[[Raw], Operation[Req, Res]] | None = None
    """Else what the bytes read name (gRPC's message names its model); may refuse (``NOT_FOUND``)."""
    declared_bytes: int = 0
    """The body's declared size (REST's Content-Length): reserved before any of it is read."""
    deadline_s: float | None = None
    """The time the caller still gives the call (gRPC's deadline), if any."""
    caller: str = ""
    """Who asks (:func:`~service.dataplane.auth.caller_of`: the API key's fingerprint): what the request owns
    (its attention sessions) belongs to it."""


class DoorObserver(SchedulerObserver, Protocol):
    """What the door reports (the service's metrics implement it): ``refused(reason)`` for each refusal."""


class Door:
    """The door of one process's data plane (module docstring); one per plane, shared by the front ends."""

    def __init__(
        self,
        *,
        admission: Admission,
        body_share: BudgetShare,
        scheduler: Scheduler,
        context: Context,
        runtime: Runtime,
        statistics: InferenceStatistics,
        trimmer: HeapTrimmer,
        debug_delay_s: float = 0.0,
        observer: DoorObserver | None = None,
    ) -> None:
        self.admission = admission
        self.body_share = body_share
        self.scheduler = scheduler
        self.context = context
        self.runtime = runtime
        self.statistics = statistics
        self.trimmer = trimmer
        self.debug_delay_s = debug_delay_s
        self.observer = observer

    def _refused(self, reason: str) -> None:
        if self.observer is not None:
            self.observer.refused(reason)

    def _admit(self, deadline_s: float | None) -> None:
        admission = self.admission
        if deadline_s is not None and admission.expected_wait_s() > deadline_s:
            self._refused("deadline")
            raise ServiceError(
                Kind.TIMEOUT,
                f"the expected wait for a compute slot ({admission.expected_wait_s():.2f} s) is longer than the "
                f"call's deadline ({deadline_s:.2f} s); retry with a longer deadline or later",
            )
        try:
            admission.admit()
        except Overloaded as exc:
            self._refused(exc.reason)
            raise unavailable(admission.refusal(exc), exc.retry_after_s) from None

    async def serve(self, call: Call[Raw, Req, Res, Out]) -> Out:
        """Admit, read, run and answer one request (module docstring): its answer in the front end's wire form."""
        self._admit(call.deadline_s)
        lease = self.body_share.lease()
        try:
            operation = call.operation
            if operation is not None:
                self.ready(operation)  # before the body is read, when the route names the model
            try:
                lease.reserve(call.declared_bytes)  # UNAVAILABLE at once when the bodies' share has no room
                raw = await call.read(lease)
            except ServiceError as exc:
                if exc.kind is Kind.UNAVAILABLE:
                    self._refused("body_memory")
                raise
            if operation is None:
                if call.named_by is None:
                    raise TypeError("a Call names its operation, or how its bytes name it")
                operation = call.named_by(raw)
                self.ready(operation)
            return await self._run(call, operation, raw, lease)
        finally:
            self.admission.leave()
            self.trimmer.release_after(lease.held)  # the body is freed: the heap is trimmed if it was large
            lease.release()

    def ready(self, operation: object) -> None:
        """``UNAVAILABLE`` while a model of the protocol is not ready (a /v1 operation's engine says so itself)."""
        model = protocol_model(operation)
        reason = None if model is None else self.runtime.not_ready_reason()
        if model is not None and reason is not None:
            raise unavailable(f"model {model.name!r} is not ready: {reason}", NOT_READY_RETRY_AFTER_S)

    async def _run(
        self, call: Call[Raw, Req, Res, Out], operation: Operation[Req, Res], raw: Raw, lease: MemoryLease
    ) -> Out:
        model = protocol_model(operation)
        if self.debug_delay_s:  # ATTN_DEBUG_DELAY_S (tests only): work that holds a compute slot this long
            await self.scheduler.hold_slot(self.debug_delay_s)
        ctx, codec, size, caller = self.context, call.codec, call.size(raw), call.caller
        if model is None:

            def prepare() -> Job[Out]:
                timing = Timing()  # from before the decoding: a /v1 answer's timing_ms.decode includes the parse
                request = codec.decode(ctx, operation, raw, caller)
                job = operation.prepare(ctx, request, timing)
                return job.then(lambda result: codec.encode(operation, request, result))

            return await self.scheduler.run(size, prepare, reserved_bytes=lease.held)
        with self.statistics.counted(model.name) as clock:

            def counted() -> Job[Out]:  # each part timed on the clock, for the statistics
                request = clock.decode(lambda: codec.decode(ctx, operation, raw, caller))
                job = operation.prepare(ctx, request, clock.model_timing())
                return job.then(lambda result: clock.encode(lambda: codec.encode(operation, request, result)))

            return await self.scheduler.run(size, counted, reserved_bytes=lease.held, waited=clock.waited)


def protocol_model(operation: object) -> Model | None:
    """``operation`` when it is a model of the protocol (readiness and statistics are the door's), else None."""
    return operation if isinstance(operation, Model) else None
