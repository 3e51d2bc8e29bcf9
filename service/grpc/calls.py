"""What every call of the inference service goes through: the API key, the request id, the error status, the
metrics and the access log line.

=========================================  ====================  ==================================
refusal                                    gRPC status           REST
=========================================  ====================  ==================================
invalid request (names the field)          INVALID_ARGUMENT      400 (/v2), 422 (/v1)
unknown model or version                   NOT_FOUND             404
over a size, work or memory limit          RESOURCE_EXHAUSTED    413
overloaded, not ready (``retry-after``)    UNAVAILABLE           503
the deadline passed, or cannot be met      DEADLINE_EXCEEDED     504
missing or wrong API key                   UNAUTHENTICATED       401
=========================================  ====================  ==================================

A status other than these is a bug: INTERNAL, with the request id to quote, and the traceback in the log.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Awaitable, Callable
from typing import NoReturn, TypeVar

import grpc
from grpc import aio

from service.dataplane.auth import MISSING_KEY, WRONG_KEY, ApiKeys, presented_key
from service.dataplane.errors import ANSWERABLE, OIP_REMEDY_WORDS, Kind, ServiceError, as_service_error, phrased
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

access_log = logging.getLogger("service.access")
logger = logging.getLogger("service.errors")

T = TypeVar("T")


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


def check_key(keys: ApiKeys | None, metadata: dict[str, str]) -> None:
    """``UNAUTHENTICATED`` unless the call presents one of the keys (``authorization: Bearer`` or ``x-api-key``)."""
    if keys is None:
        return
    key = presented_key(metadata.get("authorization"), metadata.get("x-api-key"))
    if key is None:
        raise Refused(grpc.StatusCode.UNAUTHENTICATED, MISSING_KEY)
    if not keys.accepts(key):
        raise Refused(grpc.StatusCode.UNAUTHENTICATED, WRONG_KEY)


async def abort(context: aio.ServicerContext, error: ServiceError) -> NoReturn:
    """End the call with the error's status and message (a remedy in the protocol's words: the FP64 datatype,
    as /v2 says it); ``retry-after`` (seconds) in the trailing metadata when it helps.
    """
    if error.retry_after_s is not None:
        context.set_trailing_metadata((("retry-after", str(error.retry_after_s)),))
    await context.abort(STATUS[error.kind], phrased(error, OIP_REMEDY_WORDS))
    raise AssertionError("unreachable: abort raises")  # pragma: no cover


class Calls:
    """Serves each call of the inference service with what every call needs (module docstring)."""

    def __init__(self, keys: ApiKeys | None, metrics: ServiceMetrics) -> None:
        self.keys = keys
        self.metrics = metrics

    async def serve(self, method: str, model: str, work: Callable[[], Awaitable[T]], context: aio.ServicerContext) -> T:
        """Check the key, then run ``work`` as the call ``method`` (of the model ``model``, a metrics label)."""
        route = f"/{SERVICE}/{method}"
        t0 = time.perf_counter()
        metadata = {key: value for key, value in context.invocation_metadata() or () if isinstance(value, str)}
        rid = request_id(metadata)
        token = REQUEST_ID.set(rid)
        code = grpc.StatusCode.OK
        try:
            await context.send_initial_metadata((("x-request-id", rid),))
            check_key(self.keys, metadata)
            return await work()
        except Refused as exc:
            code = exc.code
            self.metrics.refused("unauthorized")
            await context.abort(exc.code, exc.message)
            raise
        except ANSWERABLE as exc:
            error = as_service_error(exc)
            assert error is not None
            code = STATUS[error.kind]
            await abort(context, error)
        except aio.AbortError:
            code = context.code() or grpc.StatusCode.UNKNOWN  # aborted by the handler itself
            raise
        except Exception:
            code = grpc.StatusCode.INTERNAL
            logger.exception("unhandled exception while serving %s", route)
            await context.abort(
                code, f"the server failed to answer this call; quote request id {rid} when reporting it"
            )
            raise
        finally:
            self._record(route, model, code, time.perf_counter() - t0, rid)
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
