"""Reading request bodies: the declared length, the Content-Type, the body read on the data plane's memory lease,
inflated (``Content-Encoding: gzip`` or ``deflate``, with a size cap, in a worker thread) and parsed once
(:mod:`service.http.codecs.jsonbody`). Writing the answers is :mod:`service.http.responses`'.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Collection, Iterable
from typing import Any

import orjson
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request

from service.dataplane.memory import MemoryLease
from service.http.codecs import jsonbody, jsonerrors
from service.http.errors import ProblemError

_WBITS = {"gzip": 31, "x-gzip": 31, "deflate": 15}  # zlib window bits: gzip container, zlib container


INFLATE_STEP = 4 << 20
"""Inflated bytes produced (and reserved on the memory budget) per step."""


def inflate(body: bytes, encoding: str, max_bytes: int, reserve: Callable[[int], None] | None = None) -> bytes:
    """Decompress a ``gzip`` or ``deflate`` body, never producing more than ``max_bytes`` (413 past it).

    Output is bounded while it is produced, so a gzip bomb costs at most
    ``max_bytes`` of memory; ``reserve(n)`` is called before each step's ``n``
    bytes are kept (the request's memory reservation: it raises when there is
    no room). Concatenated gzip members are all inflated.
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
            while True:
                step = min(INFLATE_STEP, max_bytes - size + 1)
                chunk = d.decompress(data, step)
                size += len(chunk)
                if size > max_bytes:
                    raise ProblemError(413, f"the request body inflates to more than {max_bytes} bytes (the limit)")
                if reserve is not None:
                    reserve(len(chunk))
                out.append(chunk)
                data = d.unconsumed_tail
                if d.eof or not (data or len(chunk) == step):  # done, or no input and no output left
                    break
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


STREAMED_RESERVE_STEP = 1 << 20
"""Bytes beyond the declared length (a body without Content-Length) are held on the lease in steps of this size."""


def declared_length(request: Request) -> int:
    """The body's declared length (``Content-Length``; 0 without one): what the data plane's door holds on the
    memory budget before any of the body is read.
    """
    value = request.headers.get("content-length", "")
    return int(value) if value.isdigit() else 0


async def read_body(
    request: Request, max_bytes: int, *, json_only: bool = True, lease: MemoryLease | None = None
) -> bytes:
    """The request body, decompressed when it has ``Content-Encoding: gzip`` or ``deflate``.

    ``json_only`` (the default, every /v1 route): the Content-Type must be JSON
    (:func:`require_json`, a 415 before the body is read). With the request's ``lease`` (the data plane's door
    holds the declared length on it), what arrives beyond what it holds (a body without ``Content-Length``) is
    held on it as it arrives, and the inflated body as it is produced (``UNAVAILABLE`` when the bodies' share has
    no room). The inflated body is capped like the body on the wire, at ``max_bytes`` (``ATTN_MAX_BODY_BYTES``,
    413 past it); compressed bodies are inflated in a worker thread, off the event loop, whatever their size.
    """
    if json_only:
        require_json(request)
    if lease is None or lease.held >= declared_length(request) > 0:
        body = await request.body()  # held already (or on no lease): the size limit is the edge's, in receive
    else:
        chunks = []
        received = 0
        async for chunk in request.stream():
            received += len(chunk)
            if received > lease.held:
                lease.reserve(max(received - lease.held, STREAMED_RESERVE_STEP))
            chunks.append(chunk)
        body = b"".join(chunks)
    encoding = request.headers.get("content-encoding", "").strip().lower()
    if not encoding or encoding == "identity":
        return body
    # Always off the loop: a few KB of gzip can inflate to megabytes (up to the cap).
    return await run_in_threadpool(inflate, body, encoding, max_bytes, None if lease is None else lease.reserve)


def json_error(body: bytes, exc: orjson.JSONDecodeError) -> ProblemError:
    """The 422 for a body orjson refused; a NaN, an Infinity or a number beyond float64 is named by its field."""
    found = jsonerrors.locate_bad_number(body, exc)
    if found is None:
        msg = f"the body is not valid JSON: {jsonerrors.describe_syntax_error(body, exc)}"
        return ProblemError(422, msg, errors=[{"loc": ["body"], "msg": msg}])
    path, text, _ = found
    msg = f"the body is not valid JSON: {jsonerrors.format_path(path)} {jsonerrors.describe_bad_number(text)}"
    return ProblemError(422, msg, errors=[{"loc": list(path), "msg": msg}])


def parse_json_object(
    body: bytes, tensor_fields: Iterable[str] = (), fields: Collection[str] | None = None
) -> dict[str, Any]:
    """Parse a body as one JSON object, or raise a 422 problem (``fields``: the keys it may have, see
    :func:`~service.http.codecs.jsonbody.parse_object`).

    The top-level ``tensor_fields`` of a large body stay
    :class:`~service.http.codecs.jsonbody.JsonArray` (simdjson's tape, decoded straight
    into numpy by :func:`service.http.codecs.tensors.decode_tensor`); without them the
    result is exactly what orjson gives.
    """
    if not body:
        raise ProblemError(
            422, "the request body is empty; send a JSON object", errors=[{"loc": ["body"], "msg": "empty body"}]
        )
    obj = jsonbody.parse_object(body, tensor_fields, lambda exc: json_error(body, exc), fields)
    if not isinstance(obj, dict):
        msg = "the body must be a JSON object"
        raise ProblemError(422, msg, errors=[{"loc": ["body"], "msg": msg}])
    return obj
