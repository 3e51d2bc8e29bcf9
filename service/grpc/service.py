"""``inference.GRPCInferenceService``: the Open Inference Protocol's six calls and Triton's ``ModelStatistics``,
answered by the data plane.

The models, their inputs, outputs and parameters, the diagnostics in the response parameters, the
messages of every refusal: all are the data plane's, the same as /v2 over REST. Every call passes
:class:`~service.grpc.calls.Calls` first (its class's cap, stopping, the key), then reads its message itself
(:class:`~service.grpc.guard.Message`): ``ServerLive``, ``ServerReady`` and ``ServerMetadata`` have an empty
request and read none.

``ModelInfer`` is admitted before its message is read, as a REST request is before its body: admission is the
one REST requests pass too (a gRPC call queues behind REST requests and the other way round); a call whose
deadline is shorter than the expected wait for a compute slot is refused at once, and one whose deadline
passes while it waits leaves the queue. Its message is then read on the memory budget (the request bodies'
share, ``ATTN_BODY_MEMORY_BYTES``, one share for REST bodies and gRPC messages together: the largest message
is reserved while it arrives, then its size until the call ends, whatever its answer), and the scheduler is
told it is held, so it is reserved once. When the share (or the budget) has no room the call is refused
``UNAVAILABLE`` with REST's words and a ``retry-after`` (it does not wait). When a call that held a large
message ends, the C heap's free memory is given back (:meth:`~service.grpc.calls.Calls.handler`, as after any
method's message). A ``ModelInfer`` that a ready model takes counts in the statistics that ``ModelStatistics``
answers, as a REST inference does (:mod:`service.dataplane.statistics`).
"""

from __future__ import annotations

from typing import Any

import grpc
from google.protobuf import json_format
from google.protobuf.message import Message as Protobuf
from grpc import aio

from service import __version__
from service.dataplane.admission import Overloaded
from service.dataplane.errors import Kind, ServiceError, unavailable
from service.dataplane.models import EXTENSIONS, MODEL_VERSION, SERVER_NAME, Model, find_model
from service.dataplane.models.unsupported import UNSUPPORTED
from service.dataplane.plane import DataPlane
from service.dataplane.statistics import Clock
from service.grpc.calls import SERVICE, Calls, Handler
from service.grpc.codecs import decode_request, encode_response
from service.grpc.generated import inference_pb2 as pb
from service.grpc.guard import INFERENCE, PROBES, CallClass, Message, Reading


class InferenceService:
    """The handlers of ``inference.GRPCInferenceService`` on one data plane."""

    def __init__(self, plane: DataPlane, calls: Calls, reading: Reading) -> None:
        self.plane = plane
        self.metrics = calls.metrics
        self.calls = calls
        self.reading = reading

    def handlers(self) -> dict[str, grpc.RpcMethodHandler]:
        """The seven methods' handlers, by name (and the refusals of the extensions not served)."""
        methods: list[tuple[str, CallClass, type[Protobuf], type[Protobuf], Handler]] = [
            ("ServerLive", PROBES, pb.ServerLiveRequest, pb.ServerLiveResponse, self.ServerLive),
            ("ServerReady", PROBES, pb.ServerReadyRequest, pb.ServerReadyResponse, self.ServerReady),
            ("ServerMetadata", INFERENCE, pb.ServerMetadataRequest, pb.ServerMetadataResponse, self.ServerMetadata),
            ("ModelReady", INFERENCE, pb.ModelReadyRequest, pb.ModelReadyResponse, self.ModelReady),
            ("ModelMetadata", INFERENCE, pb.ModelMetadataRequest, pb.ModelMetadataResponse, self.ModelMetadata),
            ("ModelInfer", INFERENCE, pb.ModelInferRequest, pb.ModelInferResponse, self.ModelInfer),
            (
                "ModelStatistics",
                INFERENCE,
                pb.ModelStatisticsRequest,
                pb.ModelStatisticsResponse,
                self.ModelStatistics,
            ),
        ]
        handlers = {
            name: self.calls.handler(f"/{SERVICE}/{name}", cls, request, response, self.reading, fn)
            for name, cls, request, response, fn in methods
        }
        for extension in UNSUPPORTED:  # UNIMPLEMENTED, naming the extension; the message is never read
            for name in extension.grpc:
                handlers[name] = self.calls.refusal(f"/{SERVICE}/{name}", extension.message())
        return handlers

    async def ServerLive(self, message: Message[Any], context: aio.ServicerContext) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)  # an empty request: nothing to read

    async def ServerReady(self, message: Message[Any], context: aio.ServicerContext) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.plane.runtime.not_ready_reason() is None)

    async def ServerMetadata(self, message: Message[Any], context: aio.ServicerContext) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(name=SERVER_NAME, version=__version__, extensions=EXTENSIONS)

    async def ModelReady(self, message: Message[Any], context: aio.ServicerContext) -> pb.ModelReadyResponse:
        request: pb.ModelReadyRequest = await message.read()
        find_model(request.name, request.version or None)
        return pb.ModelReadyResponse(ready=self.plane.runtime.not_ready_reason() is None)

    async def ModelMetadata(self, message: Message[Any], context: aio.ServicerContext) -> pb.ModelMetadataResponse:
        request: pb.ModelMetadataRequest = await message.read()
        meta = find_model(request.name, request.version or None).metadata()
        tensor = pb.ModelMetadataResponse.TensorMetadata
        return pb.ModelMetadataResponse(
            name=meta["name"],
            versions=meta["versions"],
            platform=meta["platform"],
            inputs=[tensor(name=t["name"], datatype=t["datatype"], shape=t["shape"]) for t in meta["inputs"]],
            outputs=[tensor(name=t["name"], datatype=t["datatype"], shape=t["shape"]) for t in meta["outputs"]],
        )

    async def ModelInfer(self, message: Message[Any], context: aio.ServicerContext) -> pb.ModelInferResponse:
        plane = self.plane
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
        lease = plane.body_share.lease()  # held until the call ends, whatever its answer
        try:
            try:
                request: pb.ModelInferRequest = await message.read(lease)
            except ServiceError as exc:
                if exc.kind is Kind.UNAVAILABLE:
                    self.metrics.refused("body_memory")
                raise
            model = plane.ready_model(request.model_name, request.model_version or None)
            with plane.statistics.counted(model.name) as clock:
                return await self.infer(model, request, message.nbytes, lease.held, clock)
        finally:
            admission.leave()
            lease.release()

    async def infer(
        self, model: Model, request: pb.ModelInferRequest, nbytes: int, held: int, clock: Clock
    ) -> pb.ModelInferResponse:
        """``request`` (``nbytes`` long, ``held`` of them on the memory budget) run on ``model``, each part timed on
        ``clock`` for the statistics.
        """
        plane = self.plane
        delay = plane.settings.debug_delay_s
        if delay:  # ATTN_DEBUG_DELAY_S (tests only): work that holds a compute slot this long
            await plane.scheduler.hold_slot(delay)
        ctx = plane.context

        def prepare() -> Any:
            limits = model.input_limits(ctx)
            decoded = clock.decode(
                lambda: decode_request(request, model.name, model.inputs, model.output_names, limits)
            )
            job = model.prepare(ctx, decoded, clock.model_timing())
            return job.then(
                lambda result: clock.encode(lambda: encode_response(model.name, MODEL_VERSION, decoded, result))
            )

        response: pb.ModelInferResponse = await plane.scheduler.run(
            nbytes, prepare, reserved_bytes=held, waited=clock.waited
        )
        return response

    async def ModelStatistics(self, message: Message[Any], context: aio.ServicerContext) -> pb.ModelStatisticsResponse:
        request: pb.ModelStatisticsRequest = await message.read()
        report = self.plane.statistics.report(request.name, request.version)
        return json_format.ParseDict(report, pb.ModelStatisticsResponse())
