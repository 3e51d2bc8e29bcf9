"""``inference.GRPCInferenceService``: the Open Inference Protocol's six calls, Triton's ``ModelStreamInfer``
(:mod:`service.grpc.stream`) and ``ModelStatistics``, answered by the data plane.

The models, their inputs, outputs and parameters, the diagnostics in the response parameters, the
messages of every refusal: all are the data plane's, the same as /v2 over REST. Every call passes
:class:`~service.grpc.calls.Calls` first (its class's cap, stopping, the key), then reads its message itself
(:class:`~service.grpc.guard.Message`): ``ServerLive``, ``ServerReady`` and ``ServerMetadata`` have an empty
request and read none.

``ModelInfer`` enters the data plane's door in one call (:mod:`service.dataplane.door`), as a REST inference
does: admission (one for both protocols: a gRPC call queues behind REST requests and the other way round; a
call whose deadline is shorter than the expected wait for a compute slot is refused at once), its message read
on the bodies' share of the memory budget (the largest message reserved while it arrives, then its size, until
the call ends; ``UNAVAILABLE`` with REST's words and a ``retry-after`` when there is no room), the model's
readiness, the statistics, scheduling, decoding and encoding (:data:`~service.grpc.codecs.GRPC_CODEC`), and
the end. When a call that held a large message ends, the C heap's free memory is given back.
"""

from __future__ import annotations

from typing import Any

import grpc
from google.protobuf import json_format
from google.protobuf.message import Message as Protobuf
from grpc import aio

from service import __version__
from service.dataplane.door import Call
from service.dataplane.inference import InferRequest, InferResult
from service.dataplane.models import SERVER_NAME, find_model, server_extensions
from service.dataplane.models.unsupported import UNSUPPORTED
from service.dataplane.plane import DataPlane
from service.grpc.calls import SERVICE, Calls, Handler, call_caller
from service.grpc.codecs import GRPC_CODEC, named_model
from service.grpc.generated import inference_pb2 as pb
from service.grpc.guard import INFERENCE, PROBES, CallClass, Message, Reading
from service.grpc.stream import StreamInfer
from service.grpc.wire import InferMessage, parse_infer


class InferenceService:
    """The handlers of ``inference.GRPCInferenceService`` on one data plane."""

    def __init__(self, plane: DataPlane, calls: Calls, reading: Reading) -> None:
        self.plane = plane
        self.metrics = calls.metrics
        self.calls = calls
        self.reading = reading
        self.stream = StreamInfer(
            plane.door,
            plane.body_share,
            plane.runtime,
            calls,
            keys=plane.api_keys,
            sessions=plane.sessions if plane.settings.session_end_with_stream else None,
        )

    def handlers(self) -> dict[str, grpc.RpcMethodHandler]:
        """The eight methods' handlers, by name (and the refusals of the extensions not served)."""
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
            name: self.calls.handler(
                f"/{SERVICE}/{name}",
                cls,
                request,
                response,
                self.reading,
                fn,
                parse=parse_infer if request is pb.ModelInferRequest else None,  # the tensors' bytes as views
            )
            for name, cls, request, response, fn in methods
        }
        handlers["ModelStreamInfer"] = self.calls.handler(
            f"/{SERVICE}/ModelStreamInfer",
            INFERENCE,  # counts against the inference calls' cap for as long as it is open
            pb.ModelInferRequest,
            pb.ModelStreamInferResponse,
            self.reading,
            self.stream.serve,
            streaming=True,
            parse=parse_infer,
        )
        for extension in UNSUPPORTED:  # UNIMPLEMENTED, naming the extension; the message is never read
            for name in extension.grpc:
                handlers[name] = self.calls.refusal(f"/{SERVICE}/{name}", extension.message())
        return handlers

    async def ServerLive(self, message: Message[Any], context: aio.ServicerContext) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)  # an empty request: nothing to read

    async def ServerReady(self, message: Message[Any], context: aio.ServicerContext) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.plane.runtime.not_ready_reason() is None)

    async def ServerMetadata(self, message: Message[Any], context: aio.ServicerContext) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(
            name=SERVER_NAME, version=__version__, extensions=server_extensions(self.plane.sessions is not None)
        )

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
        call: Call[InferMessage, InferRequest, InferResult, pb.ModelInferResponse] = Call(
            read=message.read,
            size=lambda _: message.nbytes,
            codec=GRPC_CODEC,
            named_by=named_model,
            deadline_s=context.time_remaining(),
            caller=call_caller(self.plane.api_keys, context),
        )
        return await self.plane.door.serve(call)

    async def ModelStatistics(self, message: Message[Any], context: aio.ServicerContext) -> pb.ModelStatisticsResponse:
        request: pb.ModelStatisticsRequest = await message.read()
        report = self.plane.statistics.report(request.name, request.version)
        return json_format.ParseDict(report, pb.ModelStatisticsResponse())
