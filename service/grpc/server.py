"""The gRPC server: the inference service, standard health checking and server reflection, on its own port in
the REST server's process and event loop (:func:`service.app.create_app` starts and stops it).

- **Message sizes**: a request may be as large as a REST body (``ATTN_MAX_BODY_BYTES``, above gRPC's
  4 MiB default; past it the call ends with RESOURCE_EXHAUSTED and the limit in the message), an answer
  as large as ``ATTN_MAX_RESPONSE_BYTES``.
- **Keepalive**: the server pings quiet connections (``ATTN_GRPC_KEEPALIVE_TIME_S``), closes idle ones
  (``ATTN_GRPC_MAX_CONNECTION_IDLE_S``) and, when set, old ones (``ATTN_GRPC_MAX_CONNECTION_AGE_S``), and
  refuses clients that ping more often than ``ATTN_GRPC_MIN_CLIENT_PING_INTERVAL_S``.
- **Health** (``grpc.health.v1.Health``): SERVING for the empty service name and for
  ``inference.GRPCInferenceService`` once the engines are ready (what /readyz says), NOT_SERVING before and
  while stopping; ``Watch`` streams each change. Health and reflection need no API key (probes carry none,
  and neither holds data).
- **Several workers** (``--workers N``): each worker process serves gRPC on the same port
  (``SO_REUSEPORT``: the kernel spreads connections), as uvicorn spreads HTTP connections.
- **Stopping**: on SIGTERM the server takes no new call and gives the calls in flight up to
  ``ATTN_SHUTDOWN_GRACE_S`` to finish, while REST drains its own requests.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from google.protobuf import descriptor_pool
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio
from grpc_reflection.v1alpha import reflection, reflection_pb2

from service.dataplane.plane import DataPlane
from service.grpc.calls import END_WAIT_S, SERVICE
from service.grpc.generated import inference_pb2 as pb
from service.grpc.generated import inference_pb2_grpc as pb_grpc
from service.grpc.service import InferenceService
from service.observability.metrics import ServiceMetrics
from service.settings import Settings

logger = logging.getLogger("service")

REFLECTED = (SERVICE, "grpc.health.v1.Health", reflection.SERVICE_NAME)
READINESS_POLL_S = 0.25
"""How often health follows readiness while the engines start."""
HEALTH_NAMES = ("", SERVICE)


def reflection_pool() -> descriptor_pool.DescriptorPool:
    """The descriptors server reflection describes: the inference service's (kept in a pool of their own, see
    :mod:`service.grpc.codegen`), health checking's and reflection's own.
    """
    pool = descriptor_pool.DescriptorPool()
    for file in (pb.DESCRIPTOR, health_pb2.DESCRIPTOR, reflection_pb2.DESCRIPTOR):
        pool.AddSerializedFile(file.serialized_pb)  # type: ignore[no-untyped-call]  # typeshed leaves it untyped
    return pool


def server_options(settings: Settings) -> list[tuple[str, Any]]:
    """The channel arguments of the server (gRPC core's names)."""
    s = settings
    options: list[tuple[str, Any]] = [
        ("grpc.max_receive_message_length", s.max_body_bytes),
        ("grpc.max_send_message_length", s.max_response_bytes),
        ("grpc.keepalive_time_ms", int(s.grpc_keepalive_time_s * 1000)),
        ("grpc.keepalive_timeout_ms", int(s.grpc_keepalive_timeout_s * 1000)),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_recv_ping_interval_without_data_ms", int(s.grpc_min_client_ping_interval_s * 1000)),
        ("grpc.http2.max_ping_strikes", 2),
        ("grpc.max_connection_idle_ms", int(s.grpc_max_connection_idle_s * 1000)),
        ("grpc.so_reuseport", 1 if s.workers > 1 else 0),
    ]
    if s.grpc_max_connection_age_s:
        options += [
            ("grpc.max_connection_age_ms", int(s.grpc_max_connection_age_s * 1000)),
            ("grpc.max_connection_age_grace_ms", int(s.shutdown_grace_s * 1000)),
        ]
    return options


class GrpcServer:
    """The gRPC front end of one process: built and started on the running event loop, stopped gracefully."""

    def __init__(self, plane: DataPlane, metrics: ServiceMetrics) -> None:
        self.plane = plane
        self.metrics = metrics
        self.server: aio.Server | None = None
        self.health = health_aio.HealthServicer()
        self.port: int | None = None
        self.servicer: InferenceService | None = None
        self._watch: asyncio.Task[None] | None = None

    async def start(self) -> int:
        """Bind ``ATTN_HOST:ATTN_GRPC_PORT`` and serve; the port bound (``ATTN_GRPC_PORT=0`` picks a free one)."""
        settings = self.plane.settings
        server = aio.server(
            options=server_options(settings), maximum_concurrent_rpcs=settings.grpc_max_concurrent_rpcs or None
        )
        servicer = InferenceService(self.plane, self.metrics)
        pb_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]  # protoc
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        reflection.enable_server_reflection(REFLECTED, server, pool=reflection_pool())
        address = f"{settings.host}:{settings.grpc_port}"
        try:
            port = int(server.add_insecure_port(address))
        except RuntimeError:
            from service.startup import StartupError  # one line, no traceback (service.startup)

            raise StartupError(
                f"cannot start: the gRPC port {address} cannot be bound: another process holds it, or it is not "
                "allowed; choose another (--grpc-port / ATTN_GRPC_PORT, or ATTN_GRPC_ENABLED=false)"
            ) from None
        await self._set_health(serving=False)
        await server.start()
        self.server, self.port, self.servicer = server, port, servicer
        self._watch = asyncio.create_task(self._follow_readiness(), name="grpc-health")
        logger.info("gRPC serving inference.GRPCInferenceService on %s:%d", settings.host, port)
        return port

    async def _set_health(self, *, serving: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in HEALTH_NAMES:
            await self.health.set(name, status)

    async def _follow_readiness(self) -> None:
        """SERVING once the engines are ready; readiness is final once their start-up is over."""
        runtime = self.plane.runtime
        serving: bool | None = None
        while True:
            ready = runtime.not_ready_reason() is None
            if ready != serving:
                await self._set_health(serving=ready)
                serving = ready
            if runtime.startup_done.is_set():
                return
            await asyncio.sleep(READINESS_POLL_S)

    async def stop(self, grace_s: float) -> None:
        """Take no new call, let the calls in flight finish for up to ``grace_s``, then answer the rest
        UNAVAILABLE (module docstring).
        """
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        await self.health.enter_graceful_shutdown()
        server, self.server = self.server, None
        if server is None:
            return
        # gRPC's own end of the grace comes later: the service's calls are answered by then.
        stopping = asyncio.create_task(server.stop(grace_s + END_WAIT_S), name="grpc-server-stop")
        if self.servicer is not None:
            await self.servicer.calls.end_in_flight(grace_s)
        await stopping
