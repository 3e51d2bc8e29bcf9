"""``inference.GRPCInferenceService``: the Open Inference Protocol's six calls, answered by the data plane.

The models, their inputs, outputs and parameters, the diagnostics in the response parameters, the
messages of every refusal: all are the data plane's, the same as /v2 over REST. Admission is the one
REST requests pass too (a gRPC call queues behind REST requests and the other way round); a call whose
deadline is shorter than the expected wait for a compute slot is refused at once, and one whose
deadline passes while it waits leaves the queue.

A ``ModelInfer`` message is on the memory budget from its admission until the call ends, whatever its
answer, as a REST body is: its size (``ByteSize``) is reserved at once on the data plane's share for
request bodies (``ATTN_BODY_MEMORY_BYTES``, one share for REST bodies and gRPC messages together), and
the scheduler is told it is held, so it is reserved once. When the share (or the budget) has no room the
call is refused ``UNAVAILABLE`` with REST's words and a ``retry-after`` (it does not wait). When a call
that held a large message ends, the C heap's free memory is given back (:func:`release_after`).
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from grpc import aio

from service import __version__
from service.dataplane.admission import Overloaded
from service.dataplane.errors import Kind, ServiceError, unavailable
from service.dataplane.memory import release_after
from service.dataplane.models import EXTENSIONS, MODEL_VERSION, MODELS, SERVER_NAME, find_model
from service.dataplane.plane import DataPlane
from service.dataplane.timing import Timing
from service.grpc.calls import Calls
from service.grpc.codecs import decode_request, encode_response
from service.grpc.generated import inference_pb2 as pb
from service.grpc.generated import inference_pb2_grpc as pb_grpc
from service.observability.metrics import ServiceMetrics

Servicer = TypeVar("Servicer", bound="InferenceService")
Req = TypeVar("Req")
Resp = TypeVar("Resp")
Method = Callable[[Servicer, Req, aio.ServicerContext], Awaitable[Resp]]


def model_label(request: Any) -> str:
    """The model a request names, as a metrics label (``other`` for a name the server does not have)."""
    name = getattr(request, "model_name", None) or getattr(request, "name", "")
    return name if name in MODELS else ("other" if name else "")


def rpc(of_model: bool = False) -> Callable[[Method[Servicer, Req, Resp]], Method[Servicer, Req, Resp]]:
    """A call of the service, served through :class:`~service.grpc.calls.Calls` (key, request id, status,
    metrics, log); ``of_model``: the request names a model (the metrics' label).
    """

    def wrap(fn: Method[Servicer, Req, Resp]) -> Method[Servicer, Req, Resp]:
        @functools.wraps(fn)
        async def call(self: Servicer, request: Req, context: aio.ServicerContext) -> Resp:
            model = model_label(request) if of_model else ""
            return await self.calls.serve(fn.__name__, model, lambda: fn(self, request, context), context)

        return call

    return wrap


class InferenceService(pb_grpc.GRPCInferenceServiceServicer):
    """The servicer of ``inference.GRPCInferenceService`` on one data plane."""

    def __init__(self, plane: DataPlane, metrics: ServiceMetrics) -> None:
        self.plane = plane
        self.metrics = metrics
        self.calls = Calls(plane.api_keys, metrics, retry_after_s=plane.settings.retry_after_s)

    @rpc()
    async def ServerLive(self, request: pb.ServerLiveRequest, context: aio.ServicerContext) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    @rpc()
    async def ServerReady(self, request: pb.ServerReadyRequest, context: aio.ServicerContext) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.plane.runtime.not_ready_reason() is None)

    @rpc()
    async def ServerMetadata(
        self, request: pb.ServerMetadataRequest, context: aio.ServicerContext
    ) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(name=SERVER_NAME, version=__version__, extensions=EXTENSIONS)

    @rpc(of_model=True)
    async def ModelReady(self, request: pb.ModelReadyRequest, context: aio.ServicerContext) -> pb.ModelReadyResponse:
        find_model(request.name, request.version or None)
        return pb.ModelReadyResponse(ready=self.plane.runtime.not_ready_reason() is None)

    @rpc(of_model=True)
    async def ModelMetadata(
        self, request: pb.ModelMetadataRequest, context: aio.ServicerContext
    ) -> pb.ModelMetadataResponse:
        meta = find_model(request.name, request.version or None).metadata()
        tensor = pb.ModelMetadataResponse.TensorMetadata
        return pb.ModelMetadataResponse(
            name=meta["name"],
            versions=meta["versions"],
            platform=meta["platform"],
            inputs=[tensor(name=t["name"], datatype=t["datatype"], shape=t["shape"]) for t in meta["inputs"]],
            outputs=[tensor(name=t["name"], datatype=t["datatype"], shape=t["shape"]) for t in meta["outputs"]],
        )

    @rpc(of_model=True)
    async def ModelInfer(self, request: pb.ModelInferRequest, context: aio.ServicerContext) -> pb.ModelInferResponse:
        plane = self.plane
        model = plane.ready_model(request.model_name, request.model_version or None)
        admission = plane.admission
        remaining = context.time_remaining()
        if remaining is not None and admission.expected_wait_s() > remaining:
            self.metrics.refused("deadline")
            raise ServiceError(
                Kind.TIMEOUT,
                f"the expected wait for a compute slot ({admission.expected_wait_s():.2f} s) is longer than the "
                f"call's deadline ({remaining:.2f} s); retry with a longer deadline or later",
            )
        try:
            admission.admit()
        except Overloaded as exc:
            self.metrics.refused(exc.reason)
            raise unavailable(admission.refusal(exc), exc.retry_after_s) from None
        nbytes = request.ByteSize()
        message = plane.body_share.lease()  # held until the call ends, whatever its answer
        try:
            try:
                message.reserve(nbytes)
            except ServiceError:
                self.metrics.refused("body_memory")
                raise
            delay = plane.settings.debug_delay_s
            if delay:  # ATTN_DEBUG_DELAY_S (tests only): work that holds a compute slot this long
                await plane.scheduler.hold_slot(delay)
            ctx = plane.context

            def prepare() -> Any:
                decoded = decode_request(request, model.name, model.inputs, model.output_names, model.input_limits(ctx))
                job = model.prepare(ctx, decoded, Timing())
                return job.then(lambda result: encode_response(model.name, MODEL_VERSION, decoded, result))

            response: pb.ModelInferResponse = await plane.scheduler.run(nbytes, prepare, reserved_bytes=message.held)
            return response
        finally:
            admission.leave()
            release_after(nbytes)  # the message is freed: trim if it was large
            message.release()
