"""What the /v1 routes share: validating a body with its request model, decoding its tensors, documenting
its answers, and scheduling its work on the data plane.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any, Generic, TypeVar

import numpy as np
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import Response

from service.dataplane.context import Context
from service.dataplane.door import Call
from service.dataplane.errors import Kind, ServiceError
from service.dataplane.memory import MemoryLease
from service.dataplane.plane import DataPlane
from service.dataplane.scheduling import Job
from service.dataplane.tensors import TensorLimits
from service.dataplane.timing import Timing
from service.http.bodies import declared_length, parse_json_object, read_body
from service.http.callers import request_caller
from service.http.codecs.tensors import TensorKind, decode_tensor
from service.http.errors import pydantic_errors, summarize
from service.http.routing import RawRoute

M = TypeVar("M", bound=BaseModel)

PROBLEM_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {
        "description": desc,
        "content": {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}},
    }
    for status, desc in (
        (400, "The request body is not valid JSON, gzip or deflate data"),
        (413, "Request too large (estimated work or response size over budget)"),
        (415, "Content-Type is not JSON, or an unsupported Content-Encoding"),
        (422, "Invalid input; `errors` names each offending field"),
        (503, "Overloaded, or the engine is not ready (Retry-After)"),
    )
}


def json_body(schema: str) -> dict[str, Any]:
    """``openapi_extra`` for a route that parses its own JSON body."""
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema}"}}},
        }
    }


def json_route(
    path: str,
    endpoint: Callable[..., Any],
    *,
    tag: str,
    request: type[BaseModel],
    response: type[BaseModel],
    summary: str,
) -> APIRoute:
    """A /v1 POST route: its JSON body is ``request`` (parsed by the endpoint itself), its answer ``response``."""
    return RawRoute(
        path,
        endpoint,
        methods=["POST"],
        tags=[tag],
        response_model=response,
        responses=PROBLEM_RESPONSES,
        summary=summary,
        openapi_extra=json_body(request.__name__),
    )


def validated(model: type[M], obj: dict[str, Any]) -> M:
    """``obj`` validated by the request model, or an ``INVALID`` error naming every offending field."""
    try:
        return model.model_validate(obj)
    except ValidationError as exc:
        errors = pydantic_errors(exc)
        raise ServiceError(Kind.INVALID, summarize(errors), errors=errors) from None


@cache
def request_fields(model: type[BaseModel]) -> frozenset[str]:
    """The keys a body of ``model`` may have: its fields' names and aliases."""
    return frozenset(model.model_fields) | {f.alias for f in model.model_fields.values() if f.alias}


def parsed(model: type[M], raw: bytes, tensor_fields: tuple[str, ...]) -> M:
    """A /v1 body parsed (its tensors left for :func:`tensor`; more keys than the model has fields refused before
    they are looked up) and validated.
    """
    return validated(model, parse_json_object(raw, tensor_fields, request_fields(model)))


def tensor(value: Any, name: str, limits: TensorLimits, kind: TensorKind = "float") -> np.ndarray:
    """A wire tensor of the request decoded into numpy (its limits checked as it is decoded)."""
    return decode_tensor(value, name, kind=kind, limits=limits)


def optional_tensor(value: Any, name: str, limits: TensorLimits, kind: TensorKind = "float") -> np.ndarray | None:
    return None if value is None else decode_tensor(value, name, kind=kind, limits=limits)


D = TypeVar("D")
Out = TypeVar("Out")


@dataclass(frozen=True, slots=True)
class Route(Generic[D, Out]):
    """A /v1 route as the data plane's door takes it: its codec (``decode_body``: the JSON body parsed, validated
    and its tensors decoded; ``encode_body``: the operation's outcome as the JSON answer) and its operation (the
    data plane's, on the decoded request). The door runs the three (the first and last where the job runs).
    """

    name: str
    decode_body: Callable[[Context, bytes], D]
    operation: Callable[[Context, D, Timing], Job[Out]]
    encode_body: Callable[[D, Out], bytes]

    def prepare(self, ctx: Context, request: D, timing: Timing) -> Job[Out]:
        return self.operation(ctx, request, timing)

    def decode(self, ctx: Context, operation: object, raw: bytes, caller: str) -> D:
        return self.decode_body(ctx, raw)

    def encode(self, operation: object, request: D, result: Out) -> bytes:
        return self.encode_body(request, result)


async def answer(plane: DataPlane, request: Request, route: Route[D, Out]) -> Response:
    """A /v1 request through the data plane's door: its JSON body read on the door's lease, decoded, run and
    encoded by ``route``: the JSON answer, or the error it raised.
    """
    max_bytes = plane.settings.max_body_bytes

    async def read(lease: MemoryLease) -> bytes:
        return await read_body(request, max_bytes, lease=lease)

    call: Call[bytes, D, Out, bytes] = Call(
        read=read,
        size=len,
        codec=route,
        operation=route,
        declared_bytes=declared_length(request),
        caller=request_caller(plane, request),
    )
    return Response(await plane.door.serve(call), media_type="application/json")
