"""The gRPC server: the inference service, standard health checking and server reflection, on its own port in
the REST server's process and event loop (:func:`service.app.create_app` starts and stops it).

- **Message sizes**: a request may be as large as a REST body (``ATTN_MAX_BODY_BYTES``, above gRPC's
  4 MiB default; past it the call ends with RESOURCE_EXHAUSTED and the limit in the message), an answer
  as large as ``ATTN_MAX_RESPONSE_BYTES``.
- **Keepalive**: the server pings quiet connections (``ATTN_GRPC_KEEPALIVE_TIME_S``), closes idle ones
  (``ATTN_GRPC_MAX_CONNECTION_IDLE_S``) and, when set, old ones (``ATTN_GRPC_MAX_CONNECTION_AGE_S``), and
  refuses clients that ping more often than ``ATTN_GRPC_MIN_CLIENT_PING_INTERVAL_S``.
- **Before a message is read** (:mod:`service.grpc.guard`): every call passes its class's cap (inference,
  probes, long-lived streams: none can shut the others out), the key check and, for ``ModelInfer``,
  admission; its message then arrives under a deadline and, for ``ModelInfer``, on the memory budget. One
  connection has at most ``ATTN_GRPC_MAX_STREAMS_PER_CONNECTION`` calls served at once, and gRPC's adaptive
  flow control window is off, so an unread message holds at most 64 KiB.
- **Health** (``grpc.health.v1.Health``, :mod:`service.grpc.health`): the data plane's one readiness, as
  /readyz reads it. Health, ``ServerLive``, ``ServerReady`` and reflection need no API key by default
  (``ATTN_AUTH_EXEMPT_PATHS``: probes carry none, and none holds data).
- **Several workers** (``--workers N``): each worker process serves gRPC on the same port
  (``SO_REUSEPORT``: the kernel spreads connections), as uvicorn spreads HTTP connections.
- **Stopping**: on SIGTERM the server takes no new call and gives the calls in flight up to
  ``ATTN_SHUTDOWN_GRACE_S`` to finish, while REST drains its own requests.
"""

from __future__ import annotations

import logging
from typing import Any

import grpc
from google.protobuf import descriptor_pool
from grpc import aio
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection, reflection_pb2
from grpc_reflection.v1alpha._async import ReflectionServicer

from service.dataplane.plane import DataPlane
from service.grpc.calls import END_WAIT_S, SERVICE, Calls
from service.grpc.generated import inference_pb2 as pb
from service.grpc.guard import INFERENCE, PROBES, STREAMS, Caps, Reading
from service.grpc.health import HEALTH_SERVICE, Health, Reflection
from service.grpc.service import InferenceService
from service.observability.metrics import ServiceMetrics
from service.settings import Settings

logger = logging.getLogger("service")

REFLECTED = (SERVICE, HEALTH_SERVICE, reflection.SERVICE_NAME)
PENDING_CALLS = 8192
"""Calls gRPC core may hold before a handler starts (each holds its headers and at most a 64 KiB window)."""


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
        # An unread message waits in HTTP/2 flow control: with BDP probing on, gRPC grows a stream's window
        # ahead of the reads (20 unread 30 MB messages held 353 MB); off, each holds at most its 64 KiB window
        # (measured: 33 MB for the same 20), and a message being read still arrives at full speed.
        ("grpc.http2.bdp_probe", 0),
        # gRPC core keeps the calls that arrive faster than the handlers start in a queue, and past 1,000 (3,000
        # at most) cancels them: a burst of 3,000 tiny calls on one connection got 689 CANCELLED, which clients
        # read as their own cancel. With room for PENDING_CALLS, a burst reaches the caps instead, and a call
        # past them is refused RESOURCE_EXHAUSTED with retry-after before its message is read.
        ("grpc.server.max_pending_requests", PENDING_CALLS),
        ("grpc.server.max_pending_requests_hard_limit", PENDING_CALLS),
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
        self.port: int | None = None
        self.calls: Calls | None = None
        self.reading: Reading | None = None

    async def start(self) -> int:
        """Bind ``ATTN_HOST:ATTN_GRPC_PORT`` and serve; the port bound (``ATTN_GRPC_PORT=0`` picks a free one)."""
        settings = self.plane.settings
        plane = self.plane
        server = aio.server(options=server_options(settings))  # the caps are the classes' own (guard.Caps)
        caps = Caps(
            {
                INFERENCE: settings.grpc_max_concurrent_rpcs,
                PROBES: settings.grpc_max_concurrent_probes,
                STREAMS: settings.grpc_max_concurrent_streams,
            },
            per_connection=settings.grpc_max_streams_per_connection,
        )
        calls = Calls(
            plane.api_keys,
            self.metrics,
            caps=caps,
            runtime=plane.runtime,
            trimmer=plane.trimmer,
            needs_key=plane.needs_key,
            retry_after_s=settings.retry_after_s,
        )
        reading = Reading(
            max_bytes=settings.max_body_bytes, share_bytes=plane.body_share.capacity, timeout_s=settings.body_timeout_s
        )
        services = {
            SERVICE: InferenceService(plane, calls, reading).handlers(),
            HEALTH_SERVICE: Health(plane.runtime, calls, reading).handlers(),
            reflection.SERVICE_NAME: Reflection(
                ReflectionServicer(REFLECTED, pool=reflection_pool()), calls, reading
            ).handlers(),
        }
        server.add_generic_rpc_handlers(
            tuple(grpc.method_handlers_generic_handler(name, handlers) for name, handlers in services.items())
        )
        address = f"{settings.host}:{settings.grpc_port}"
        try:
            port = int(server.add_insecure_port(address))
        except RuntimeError:
            from service.startup import StartupError  # one line, no traceback (service.startup)

            raise StartupError(
                f"cannot start: the gRPC port {address} cannot be bound: another process holds it, or it is not "
                "allowed; choose another (--grpc-port / ATTN_GRPC_PORT, or ATTN_GRPC_ENABLED=false)"
            ) from None
        await server.start()
        self.server, self.port, self.calls, self.reading = server, port, calls, reading
        logger.info("gRPC serving inference.GRPCInferenceService on %s:%d", settings.host, port)
        return port

    async def stop(self, grace_s: float) -> None:
        """Answer every new call UNAVAILABLE with retry-after (health NOT_SERVING, ``Watch`` streams end), let the
        calls in flight finish for up to ``grace_s``, answer the rest UNAVAILABLE, then close the port.

        gRPC's own graceful stop would refuse new calls at once with a GOAWAY (UNAVAILABLE with no retry-after,
        and CANCELLED for calls it had taken but no handler had started): it runs only once the calls are done.
        """
        self.plane.runtime.begin_stopping()  # already, when a signal began the stop: health says NOT_SERVING
        server, self.server = self.server, None
        if server is None:
            return
        if self.calls is not None:
            await self.calls.end_in_flight(grace_s)
        await server.stop(END_WAIT_S)
        if self.reading is not None:
            await self.reading.stop()
