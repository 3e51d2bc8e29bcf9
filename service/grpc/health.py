"""``grpc.health.v1.Health`` and server reflection, served through :class:`~service.grpc.calls.Calls` like every call.

Health reads the data plane's one readiness (:class:`~service.dataplane.runtime.Runtime`), as REST's ``/readyz``
does at the same instant: SERVING for the empty service name and for ``inference.GRPCInferenceService`` once the
engines are ready, NOT_SERVING before and from the moment the server begins to stop; NOT_FOUND for another name
(``Watch`` streams SERVICE_UNKNOWN, as the protocol asks). ``Watch`` streams each change as it happens (the
runtime calls back; nothing polls), and ends once it has sent NOT_SERVING for the server's stop. ``Check`` is
a probe (its own cap); ``Watch`` and reflection are long-lived
streams (theirs). All three are exempt from the API key by default (``ATTN_AUTH_EXEMPT_PATHS``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
from grpc import aio
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection, reflection_pb2
from grpc_reflection.v1alpha._async import ReflectionServicer

from service.dataplane.errors import Kind, ServiceError
from service.dataplane.runtime import Runtime
from service.grpc.calls import SERVICE, Calls
from service.grpc.guard import PROBES, STREAMS, Message, Reading

HEALTH_SERVICE = "grpc.health.v1.Health"
HEALTH_NAMES = ("", SERVICE)
Status = health_pb2.HealthCheckResponse


class Health:
    """The health service over one runtime's readiness."""

    def __init__(self, runtime: Runtime, calls: Calls, reading: Reading) -> None:
        self.runtime = runtime
        self.calls = calls
        self.reading = reading
        self._watchers: set[asyncio.Event] = set()
        loop = asyncio.get_running_loop()

        def changed() -> None:  # from any thread: the watchers are woken on the loop
            loop.call_soon_threadsafe(self._notify)

        runtime.on_change(changed)

    def _notify(self) -> None:
        for event in self._watchers:
            event.set()

    def status(self, service: str) -> Any:
        """The status of ``service`` now, or None for a name the server does not serve."""
        if service not in HEALTH_NAMES:
            return None
        return Status.SERVING if self.runtime.not_ready_reason() is None else Status.NOT_SERVING

    async def check(self, message: Message[Any], context: aio.ServicerContext) -> health_pb2.HealthCheckResponse:
        request: health_pb2.HealthCheckRequest = await message.read()
        status = self.status(request.service)
        if status is None:
            raise ServiceError(Kind.NOT_FOUND, f"unknown service {request.service!r}; this server has {HEALTH_NAMES}")
        return Status(status=status)

    async def watch(self, message: Message[Any], context: aio.ServicerContext) -> None:
        request: health_pb2.HealthCheckRequest = await message.read()
        changed = asyncio.Event()
        self._watchers.add(changed)
        try:
            last = None
            while True:
                changed.clear()
                status = self.status(request.service)
                status = Status.SERVICE_UNKNOWN if status is None else status
                if status != last:
                    await context.write(Status(status=status))
                    last = status
                if self.runtime.stopping and last != Status.SERVING:
                    return  # NOT_SERVING sent: the stream ends, so the server's stop need not wait for it
                await changed.wait()
        finally:
            self._watchers.discard(changed)

    def handlers(self) -> dict[str, grpc.RpcMethodHandler]:
        request, response = health_pb2.HealthCheckRequest, health_pb2.HealthCheckResponse
        route = f"/{HEALTH_SERVICE}/"
        return {
            "Check": self.calls.handler(route + "Check", PROBES, request, response, self.reading, self.check),
            "Watch": self.calls.handler(
                route + "Watch", STREAMS, request, response, self.reading, self.watch, streaming=True
            ),
        }


class Reflection:
    """Server reflection (grpcurl, Postman), each request a small message read like a probe's."""

    def __init__(self, servicer: ReflectionServicer, calls: Calls, reading: Reading) -> None:
        self.servicer = servicer
        self.calls = calls
        self.reading = reading

    async def info(self, message: Message[Any], context: aio.ServicerContext) -> None:
        async def requests() -> AsyncIterator[reflection_pb2.ServerReflectionRequest]:
            while (request := await message.next()) is not None:
                yield request

        async for answer in self.servicer.ServerReflectionInfo(requests(), context):
            await context.write(answer)

    def handlers(self) -> dict[str, grpc.RpcMethodHandler]:
        request, response = reflection_pb2.ServerReflectionRequest, reflection_pb2.ServerReflectionResponse
        route = f"/{reflection.SERVICE_NAME}/ServerReflectionInfo"
        handler = self.calls.handler(route, STREAMS, request, response, self.reading, self.info, streaming=True)
        return {"ServerReflectionInfo": handler}
