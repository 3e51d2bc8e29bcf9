"""Reading request bodies, running their CPU work, and writing JSON responses with orjson.

FastAPI's default path (jsonable_encoder + json.dumps) is about 20x slower
than orjson on large arrays, so routes read the raw body, parse it once with
orjson and answer with bytes serialized straight from numpy. Bodies sent with
``Content-Encoding: gzip`` or ``deflate`` are inflated with a size cap, in a
worker thread; :func:`run_cpu` keeps the CPU work of all but cheap requests off
the event loop, and holds one of the admission's compute slots around it.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable
from contextvars import ContextVar
from typing import Any, TypeVar

import numpy as np
import orjson
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware.gzip import GZipMiddleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from service.api import jsonbody
from service.api.errors import ProblemError
from service.api.memory import leased

DEFAULT_MAX_BODY_BYTES = 32 << 20
"""Cap on an inflated request body when the app has no ``max_body_bytes`` setting."""

_WBITS = {"gzip": 31, "x-gzip": 31, "deflate": 15}  # zlib window bits: gzip container, zlib container
INLINE_MAX_RESPONSE_BYTES = 64 << 10
"""A request computed on the event loop must also have a small answer (serializing it is loop time too)."""

JSON_OPTIONS = orjson.OPT_SERIALIZE_NUMPY

T = TypeVar("T")


def _fallback(obj: Any) -> Any:
    """What orjson's numpy path skips: 0-d and non-contiguous arrays, numpy scalars."""
    if isinstance(obj, np.ndarray | np.generic):
        return obj.tolist()
    raise TypeError(f"cannot serialize {type(obj).__name__}")


class GZipIfAccepted(GZipMiddleware):
    """Starlette's GZipMiddleware, out of the way of clients that do not accept gzip.

    Starlette wraps every response, compressed or not (to add ``Vary:
    Accept-Encoding``), which costs tens of microseconds a request and a
    byte-wise comparison of large bodies; the API's POST answers are not
    cached, so requests without gzip in ``Accept-Encoding`` go straight through.
    Compressed answers keep their other headers: ``Inference-Header-Content-Length``
    still counts the JSON of the uncompressed body, as Triton does.
    """

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            for name, value in scope["headers"]:
                if name == b"accept-encoding" and b"gzip" in value:
                    await super().__call__(scope, receive, send)
                    return
        await self.app(scope, receive, send)


def inflate(body: bytes, encoding: str, max_bytes: int) -> bytes:
    """Decompress a ``gzip`` or ``deflate`` body, never producing more than ``max_bytes`` (413 past it).

    Output is bounded while it is produced, so a gzip bomb costs at most
    ``max_bytes`` of memory. Concatenated gzip members are all inflated.
    """
    wbits = _WBITS.get(encoding)
    if wbits is None:
        raise ProblemError(
            415,
            f"Content-Encoding {encoding!r} is not supported; use gzip, deflate or identity",
            headers={"Accept-Encoding": "gzip, deflate"},
        )
    out: list[bytes] = []
    size = 0
    data = body
    try:
        while data:
            d = zlib.decompressobj(wbits)
            chunk = d.decompress(data, max_bytes - size + 1)
            size += len(chunk)
            out.append(chunk)
            if size > max_bytes:
                raise ProblemError(413, f"the request body inflates to more than {max_bytes} bytes (the limit)")
            if not d.eof:
                raise ProblemError(400, f"the {encoding} request body is truncated")
            data = d.unused_data if wbits == 31 else b""  # another gzip member may follow
    except zlib.error as exc:
        raise ProblemError(400, f"the request body is not valid {encoding} data: {exc}") from None
    return out[0] if len(out) == 1 else b"".join(out)


JSON_MEDIA_TYPES = "application/json or application/*+json"


def is_json_media_type(content_type: str) -> bool:
    """``application/json`` or a structured ``application/<name>+json`` (RFC 6839), parameters aside.

    A ``charset`` parameter, if any, must be UTF-8: JSON on the wire is UTF-8 (RFC 8259, section 8.1).
    """
    media, _, params = content_type.partition(";")
    kind = media.strip().lower()
    if not (kind == "application/json" or (kind.startswith("application/") and kind.endswith("+json"))):
        return False
    for param in params.split(";"):
        name, _, value = param.partition("=")
        if name.strip().lower() == "charset" and value.strip().strip('"').lower() not in ("utf-8", "utf8"):
            return False
    return True


def require_json(request: Request) -> None:
    """415 (problem+json) unless the request says its body is JSON, checked before the body is read.

    A request without ``Content-Type`` is read as JSON (curl and scripts often leave it out; the
    body must still parse as JSON); any other type (``text/plain``, ``multipart/form-data``, the
    ``application/x-www-form-urlencoded`` that ``curl -d`` sends by default) is refused.
    """
    content_type = request.headers.get("content-type")
    if content_type is None or is_json_media_type(content_type):
        return
    raise ProblemError(
        415,
        f"Content-Type {content_type!r} is not supported; send the body as {JSON_MEDIA_TYPES} (UTF-8)",
        headers={"Accept-Post": "application/json"},
    )


async def read_body(request: Request, *, json_only: bool = True) -> bytes:
    """The request body, decompressed when it has ``Content-Encoding: gzip`` or ``deflate``.

    ``json_only`` (the default, every /v1 route): the Content-Type must be JSON
    (:func:`require_json`, a 415 before the body is read). The inflated body is
    capped like the body on the wire, by the setting ``max_body_bytes`` (413
    past it); compressed bodies are inflated in a worker thread, off the event
    loop, whatever their size.
    """
    if json_only:
        require_json(request)
    body = await request.body()
    encoding = request.headers.get("content-encoding", "").strip().lower()
    if not encoding or encoding == "identity":
        return body
    runtime = getattr(request.app.state, "runtime", None)
    cap = getattr(getattr(runtime, "settings", None), "max_body_bytes", DEFAULT_MAX_BODY_BYTES)
    # Always off the loop: a few KB of gzip can inflate to megabytes (up to the cap).
    return await run_in_threadpool(inflate, body, encoding, cap)


class CostlyForTheLoop(BaseException):
    """Raised by :func:`check_inline` in work started on the event loop that turns out costly.

    A BaseException so that no ``except Exception`` in a handler turns it into an error answer:
    :func:`run_cpu` catches it and runs the work again in a worker thread.
    """


_INLINE_LIMITS: ContextVar[tuple[float, int] | None] = ContextVar("inline_limits", default=None)


def check_inline(flops: float, response_bytes: int) -> None:
    """Stop work on the event loop that is not cheap (:func:`run_cpu` moves it to a thread).

    Called with a request's work estimate (:func:`service.api.budget.check` does); a no-op for
    work already in a worker thread.
    """
    limits = _INLINE_LIMITS.get()
    if limits is not None and (flops > limits[0] or response_bytes > limits[1]):
        raise CostlyForTheLoop


async def run_cpu(request: Request, body_size: int, fn: Callable[..., T], *args: Any) -> T:
    """Run a request's CPU work: on the event loop when it is cheap, else in the thread pool holding a
    compute slot of the admission (``app.state.admission``; 503 when none comes in time).

    Cheap means both a small body (at most ``inline_max_body_bytes``, so parsing is cheap) and a small
    work estimate (at most ``inline_max_work_flops`` and an answer of at most 64 KiB, checked by
    :func:`check_inline` from the budget check, after parsing and before computing): such work costs
    less than the hop to a worker thread and back. Work found costly is run again in a thread; by body
    size alone, a 2 KB request can hold the loop for tens of milliseconds (bisection entmax over a
    long key axis).

    The work runs under a lease of the process-wide memory budget
    (:mod:`service.api.memory`): the body's bytes first, then what
    ``budget.enforce`` reserves once the shapes are known; all of it is given
    back when the work ends. Work on the event loop never waits for room.
    """
    state = request.app.state
    runtime = getattr(state, "runtime", None)
    settings = getattr(runtime, "settings", None)
    memory = getattr(runtime, "memory", None)

    def work(inline: bool) -> T:
        with leased(memory, wait=not inline) as lease:
            if lease is not None:
                lease.reserve(body_size)
            return fn(*args)

    if body_size <= getattr(settings, "inline_max_body_bytes", 0):
        token = _INLINE_LIMITS.set((getattr(settings, "inline_max_work_flops", 0.0), INLINE_MAX_RESPONSE_BYTES))
        try:
            return work(True)
        except CostlyForTheLoop:
            pass
        finally:
            _INLINE_LIMITS.reset(token)
    admission = getattr(state, "admission", None)
    if admission is None:
        return await run_in_threadpool(work, False)
    metrics = getattr(state, "metrics", None)
    from service.middleware.limits import Overloaded  # the middleware package imports this module

    try:
        async with admission.computing() as waited:
            if metrics is not None:
                metrics.queue_wait.observe(waited)
            return await run_in_threadpool(work, False)
    except Overloaded as exc:
        if metrics is not None:
            metrics.rejected.labels(exc.reason).inc()
        raise HTTPException(
            503,
            f"no compute slot became free within {admission.gate.queue_timeout_s:g} s; "
            f"retry after {exc.retry_after_s} s",
            headers={"Retry-After": str(exc.retry_after_s)},
        ) from None


def json_error(body: bytes, exc: orjson.JSONDecodeError) -> ProblemError:
    """The 422 for a body orjson refused; a NaN, an Infinity or a number beyond float64 is named by its field."""
    found = jsonbody.locate_bad_number(body, exc)
    if found is None:
        msg = f"the body is not valid JSON: {exc}"
        return ProblemError(422, msg, errors=[{"loc": ["body"], "msg": msg}])
    path, text, _ = found
    msg = f"the body is not valid JSON: {jsonbody.format_path(path)} {jsonbody.describe_bad_number(text)}"
    return ProblemError(422, msg, errors=[{"loc": list(path), "msg": msg}])


def parse_json_object(body: bytes, tensor_fields: Iterable[str] = ()) -> dict[str, Any]:
    """Parse a body as one JSON object, or raise a 422 problem.

    The top-level ``tensor_fields`` of a large body stay
    :class:`~service.api.jsonbody.JsonArray` (simdjson's tape, decoded straight
    into numpy by :func:`service.api.codecs.decode_tensor`); without them the
    result is exactly what orjson gives.
    """
    if not body:
        raise ProblemError(
            422, "the request body is empty; send a JSON object", errors=[{"loc": ["body"], "msg": "empty body"}]
        )
    obj = jsonbody.parse_object(body, tensor_fields, lambda exc: json_error(body, exc))
    if not isinstance(obj, dict):
        msg = "the body must be a JSON object"
        raise ProblemError(422, msg, errors=[{"loc": ["body"], "msg": msg}])
    return obj


def json_response(content: Any, status_code: int = 200, headers: dict[str, str] | None = None) -> Response:
    """Serialize with orjson (numpy arrays natively; NaN and infinities become null)."""
    return Response(
        orjson.dumps(content, option=JSON_OPTIONS, default=_fallback),
        status_code=status_code,
        media_type="application/json",
        headers=headers,
    )
