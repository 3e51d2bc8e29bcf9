"""What every call goes through (the inference service's, health checking's and reflection's): its class's cap,
the server stopping, the API key (read from the metadata before any of the message), the request id, the error
status, the metrics and the access log line.

==============================================  ====================  ==================================
refusal                                         gRPC status           REST
==============================================  ====================  ==================================
invalid request, undecodable message            INVALID_ARGUMENT      400 (/v2), 422 (/v1)
unknown model or version                        NOT_FOUND             404
over a size, work or memory limit               RESOURCE_EXHAUSTED    413
its class's calls at their cap (retry-after)    RESOURCE_EXHAUSTED    503
busy, not ready, stopping (retry-after)         UNAVAILABLE           503
the deadline passed, or cannot be met           DEADLINE_EXCEEDED     504
the message did not arrive in time              DEADLINE_EXCEEDED     408
missing or wrong API key                        UNAUTHENTICATED       401
an extension this server does not serve         UNIMPLEMENTED         404
the client cancelled, or went away              CANCELLED             499 (logged)
==============================================  ====================  ==================================

"Busy": no room in admission, or in the memory share that request bodies and messages hold. A status other
than these is a bug: INTERNAL, with the request id to quote, and the traceback in the log.

**Stopping**: from the moment the server begins to stop, an inference call that arrives is answered
``UNAVAILABLE`` with ``retry-after`` before its message is read (counted as the refusal ``stopping``); probes
answer, not ready.

**Stopping**: :meth:`Calls.end_in_flight` waits for the calls in flight for up to the shutdown grace
(``ATTN_SHUTDOWN_GRACE_S``); those still running then are cancelled and answered ``UNAVAILABLE``, with a
message saying the server is shutting down and ``retry-after`` in the trailing metadata (counted as the
refusal ``shutdown`` and logged as a warning, without a traceback), as REST answers them 503. Left to
itself, gRPC would end them with ``UNAVAILABLE`` "Cancelling all calls", no ``retry-after``, and the log
would count them ``OK``. A call the server cancels for another reason (the client went away, or its
deadline passed) is logged and counted ``CANCELLED``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn, TypeVar

import grpc
from google.protobuf.message import Message as Protobuf
from grpc import aio

from service.dataplane.auth import MISSING_KEY, WRONG_KEY, ApiKeys, caller_of, presented_key
from service.dataplane.errors import (
    ANSWERABLE,
    OIP_REMEDY_WORDS,
    Kind,
    ServiceError,
    as_service_error,
    phrased,
    unavailable,
)
from service.dataplane.heap import HeapTrimmer
from service.dataplane.models import MODELS
from service.dataplane.runtime import Runtime
from service.grpc.guard import INFERENCE, AtCap, CallClass, Caps, Message, MessageTimeout, Reading
from service.observability.logs import REQUEST_ID
from service.observability.metrics import ServiceMetrics

SERVICE = "inference.GRPCInferenceService"
REQUEST_ID_PATTERN_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:-")
STATUS = {
    Kind.INVALID: grpc.StatusCode.INVALID_ARGUMENT,
    Kind.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    Kind.TOO_LARGE: grpc.StatusCode.RESOURCE_EXHAUSTED,
    Kind.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    Kind.TIMEOUT: grpc.StatusCode.DEADLINE_EXCEEDED,
}

STOPPING_MESSAGE = "the server is stopping and takes no new call; retry it (another instance will answer)"
SHUTDOWN_MESSAGE = (
    "the server is shutting down and its grace period for calls in flight (ATTN_SHUTDOWN_GRACE_S) ended before "
    "this one was answered; retry it"
)
END_WAIT_S = 1.0
"""How long the calls cancelled at the end of the grace may take to send their answer."""

access_log = logging.getLogger("service.access")
logger = logging.getLogger("service.errors")
limits_logger = logging.getLogger("service.limits")

T = TypeVar("T")
Handler = Callable[[Message[Any], aio.ServicerContext], Awaitable[Any]]
"""A method's work: its unread message and the call's context in, the answer out (None: a stream that writes)."""


def model_label(request: Any) -> str:
    """The model a request names, as a metrics label (``other`` for a name the server does not have)."""
    name = getattr(request, "model_name", None) or getattr(request, "name", "")
    return name if name in MODELS else ("other" if name else "")


class Refused(Exception):
    """A call refused before it reached the data plane (a missing or wrong key)."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def request_id(metadata: dict[str, str]) -> str:
    """The caller's ``x-request-id`` when it is safe in logs (1 to 128 of ``[A-Za-z0-9._:-]``), else a new one."""
    incoming = metadata.get("x-request-id", "")
    if 0 < len(incoming) <= 128 and set(incoming) <= REQUEST_ID_PATTERN_CHARS:
        return incoming
    return os.urandom(16).hex()


def call_caller(keys: ApiKeys | None, context: aio.ServicerContext) -> str:
    """Who a call is, for what it owns (its attention sessions): :func:`~service.dataplane.auth.caller_of` of the key
    in its metadata (checked before its message was read), "" without keys.
    """
    if keys is None:
        return ""
    metadata = {key: value for key, value in context.invocation_metadata() or () if isinstance(value, str)}
    return caller_of(keys, presented_key(metadata.get("authorization"), metadata.get("x-api-key")))


def check_key(keys: ApiKeys | None, metadata: dict[str, str]) -> None:
    """``UNAUTHENTICATED`` unless the call presents one of the keys (``authorization: Bearer`` or ``x-api-key``)."""
    if keys is None:
        return
    key = presented_key(metadata.get("authorization"), metadata.get("x-api-key"))
    if key is None:
        raise Refused(grpc.StatusCode.UNAUTHENTICATED, MISSING_KEY)
    if not keys.accepts(key):
        raise Refused(grpc.StatusCode.UNAUTHENTICATED, WRONG_KEY)


async def abort(context: aio.ServicerContext, error: ServiceError, rid: str) -> NoReturn:
    """End the call with the error's status and message (a remedy in the protocol's words: the FP64 datatype,
    as /v2 says it); ``retry-after`` (seconds) in the trailing metadata when it helps, beside ``x-request-id``.
    """
    trailing: tuple[tuple[str, str], ...] = (("x-request-id", rid),)
    if error.retry_after_s is not None:
        trailing += (("retry-after", str(error.retry_after_s)),)
    context.set_trailing_metadata(trailing)
    await context.abort(STATUS[error.kind], phrased(error, OIP_REMEDY_WORDS))
    raise AssertionError("unreachable: abort raises")  # pragma: no cover


class Calls:
    """Serves each call with what every call needs (module docstring)."""

    def __init__(
        self,
        keys: ApiKeys | None,
        metrics: ServiceMetrics,
        *,
        caps: Caps,
        runtime: Runtime,
        trimmer: HeapTrimmer,
        needs_key: Callable[[str], bool] | None = None,
        retry_after_s: int = 1,
    ) -> None:
        self.keys = keys
        self.metrics = metrics
        self.caps = caps
        self.runtime = runtime
        self.trimmer = trimmer
        """The data plane's: a call's message freed, the C heap is trimmed soon if it was large, else once quiet."""
        self.needs_key = needs_key or (lambda route: keys is not None)
        """Whether a call of a method (its full name) must present a key: the data plane's rule
        (:meth:`~service.dataplane.plane.DataPlane.needs_key`, ``ATTN_AUTH_EXEMPT_PATHS``), as for REST paths."""
        self.retry_after_s = retry_after_s
        self._running: set[asyncio.Task[Any]] = set()
        """The tasks of the calls in flight (gRPC runs each call in a task of its own)."""
        self._ended: set[asyncio.Task[Any]] = set()
        """Those cancelled by :meth:`end_in_flight`."""
        self._idle = asyncio.Event()
        self._idle.set()

    def handler(
        self,
        route: str,
        cls: CallClass,
        request: type[Protobuf],
        response: type[Protobuf],
        reading: Reading,
        fn: Handler,
        *,
        streaming: bool = False,
        parse: Callable[[bytes], Any] | None = None,
    ) -> grpc.RpcMethodHandler:
        """The method ``route`` served as a client-streaming one (server-streaming too with ``streaming``), so that
        its handler runs before its message is read (:mod:`service.grpc.guard`): through :meth:`serve`, then
        ``fn`` with the unread message, which ``parse`` reads (``request``'s parser by default).
        """
        parser = request.FromString if parse is None else parse

        async def behavior(requests: Any, context: aio.ServicerContext) -> Any:
            message: Message[Any] = Message(context, parser, reading)
            work = lambda: fn(message, context)  # noqa: E731
            try:
                return await self.serve(route, cls, work, context, lambda: model_label(message.value))
            finally:
                if message.nbytes:  # the message is freed: trim soon if it was large, else once quiet
                    self.trimmer.release_after(message.nbytes)

        if streaming:
            return grpc.stream_stream_rpc_method_handler(
                behavior, request_deserializer=None, response_serializer=response.SerializeToString
            )
        return grpc.stream_unary_rpc_method_handler(
            behavior, request_deserializer=None, response_serializer=response.SerializeToString
        )

    def refusal(self, route: str, message: str) -> grpc.RpcMethodHandler:
        """The method ``route``, which this server does not serve: ``UNIMPLEMENTED`` with ``message``, through
        :meth:`serve` (key, log, metrics), without reading the request.
        """

        async def behavior(requests: Any, context: aio.ServicerContext) -> Any:
            async def refuse() -> None:
                await context.abort(grpc.StatusCode.UNIMPLEMENTED, message)

            return await self.serve(route, INFERENCE, refuse, context)

        return grpc.stream_unary_rpc_method_handler(behavior)

    async def end_in_flight(self, grace_s: float) -> None:
        """Let the calls in flight run for up to ``grace_s``, then end those still running with ``UNAVAILABLE``
        (module docstring), waiting up to :data:`END_WAIT_S` for their answers to go out.
        """
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(grace_s):
                await self._idle.wait()
        if not self._running:
            return
        self._ended |= self._running
        for task in self._running:
            task.cancel()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(END_WAIT_S):
                await self._idle.wait()

    async def serve(
        self,
        route: str,
        cls: CallClass,
        work: Callable[[], Awaitable[T]],
        context: aio.ServicerContext,
        model: Callable[[], str] = str,
    ) -> T:
        """Run ``work`` as the call ``route`` (``/package.Service/Method``, of the class ``cls``) once its class has
        room, the server is not stopping and the key checked; ``model``: the model the call named, once its
        message is read (a metrics label).
        """
        t0 = time.perf_counter()
        metadata = {key: value for key, value in context.invocation_metadata() or () if isinstance(value, str)}
        rid = request_id(metadata)
        token = REQUEST_ID.set(rid)
        code = grpc.StatusCode.OK
        task = asyncio.current_task()
        if task is not None:
            self._running.add(task)
            self._idle.clear()
        try:
            # In the trailing metadata, sent with the status: initial metadata sent on its own cost 0.11 ms a call.
            context.set_trailing_metadata((("x-request-id", rid),))
            if self.runtime.stopping and cls is INFERENCE:  # probes still answer: NOT_SERVING, ready false
                self.metrics.refused("stopping")
                raise unavailable(STOPPING_MESSAGE, self.retry_after_s)
            if self.needs_key(route):
                check_key(self.keys, metadata)
            try:
                with self.caps.slot(cls, context.peer(), self.retry_after_s):
                    return await work()
            except AtCap:
                self.metrics.refused("grpc_calls")
                raise
            except MessageTimeout:
                self.metrics.refused("message_timeout")
                raise
        except Refused as exc:
            code = exc.code
            self.metrics.refused("unauthorized")
            await context.abort(exc.code, exc.message)
            raise
        except ANSWERABLE as exc:
            error = as_service_error(exc)
            assert error is not None
            code = STATUS[error.kind]
            await abort(context, error, rid)
        except aio.AbortError:
            code = context.code() or grpc.StatusCode.UNKNOWN  # aborted by the handler itself
            raise
        except asyncio.CancelledError:
            if task is None or task not in self._ended:
                code = grpc.StatusCode.CANCELLED  # the client went away, or its deadline passed
                raise
            task.uncancel()  # ended by the shutdown: answered here, and the task ends normally
            code = grpc.StatusCode.UNAVAILABLE
            self.metrics.refused("shutdown")
            limits_logger.warning("call still in flight when the shutdown grace ended: %s", route)
            await abort(context, unavailable(SHUTDOWN_MESSAGE, self.retry_after_s), rid)
        except Exception:
            code = grpc.StatusCode.INTERNAL
            logger.exception("unhandled exception while serving %s", route)
            await context.abort(
                code, f"the server failed to answer this call; quote request id {rid} when reporting it"
            )
            raise
        finally:
            if task is not None:
                self._running.discard(task)
                self._ended.discard(task)
                if not self._running:
                    self._idle.set()
            self._record(route, model(), code, time.perf_counter() - t0, rid)
            REQUEST_ID.reset(token)

    def _record(self, route: str, model: str, code: grpc.StatusCode, seconds: float, rid: str) -> None:
        status = code.name
        self.metrics.observe_request("POST", route, status, seconds, protocol="grpc", model=model)
        if access_log.isEnabledFor(logging.INFO):
            access_log.info(
                "request",
                extra={
                    "protocol": "grpc",
                    "method": "POST",
                    "path": route,
                    "status": status,
                    "duration_ms": round(seconds * 1e3, 3),
                    "request_id": rid,
                },
            )
