"""How the REST routes are served: FastAPI documents them, and a request reaches its endpoint directly.

FastAPI's ``APIRoute`` solves an endpoint's dependencies on every request even when the only one is
the ``Request``; the service's endpoints take the raw ``Request`` (and their path parameters) and parse
their bodies themselves, so :class:`RawRoute` keeps what FastAPI builds from the signature for the
OpenAPI schema and calls the endpoint straight away. :class:`V2Route` also answers every request error
in the Open Inference Protocol's ``{"error": message}`` form instead of problem+json.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Match, Route, request_response
from starlette.types import Scope

from service.http.error_responses import V2_ERRORS, v2_error

Handler = Callable[[Request], Coroutine[Any, Any, Response]]

OPERATION_IDS: dict[tuple[str, str], str] = {
    ("POST", "/v1/attention"): "attention",
    ("POST", "/v1/softmax"): "softmax",
    ("POST", "/v1/attention/analyze"): "analyze",
    ("POST", "/v1/attention/rollout"): "attention_rollout",
    ("POST", "/v1/sessions/{sequence_id}/steps"): "session_step",
    ("GET", "/metrics"): "metrics",
    ("POST", "/v2/models/{model_name}/infer"): "model_infer",
    ("POST", "/v2/models/{model_name}/versions/{model_version}/infer"): "model_version_infer",
}
"""Ids that differ from the route function's name (see :func:`operation_id`)."""


def operation_id(route: APIRoute) -> str:
    """The operation id of a route: from :data:`OPERATION_IDS`, else the function's name without a
    ``post_``/``get_`` prefix (``post_attention_backward`` -> ``attention_backward``): readable names in
    generated SDKs.
    """
    for method in sorted(route.methods or ()):
        named = OPERATION_IDS.get((method, route.path_format))
        if named:
            return named
    name = route.name
    for prefix in ("post_", "get_"):
        if name.startswith(prefix):
            return name[len(prefix) :]
    return name


class RawRoute(APIRoute):
    """A route documented by FastAPI whose endpoint is called with the ``Request`` and its path parameters.

    It is served as a plain Starlette route: Starlette's ``request_response`` (FastAPI's adds two
    ``AsyncExitStack`` per request, for dependencies with ``yield`` and uploaded files, which these
    endpoints never have) and Starlette's matching (FastAPI's looks for the context of an included
    router first; these routes are the app's own).
    """

    def __init__(self, path: str, endpoint: Callable[..., Any], **kwargs: Any) -> None:
        kwargs.setdefault("generate_unique_id_function", operation_id)
        super().__init__(path, endpoint, **kwargs)
        self.app = request_response(self.get_route_handler())

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        match, child_scope = Route.matches(self, scope)
        if match != Match.NONE:
            child_scope["route"] = self
        return match, child_scope

    def get_route_handler(self) -> Handler:
        endpoint = self.endpoint

        async def handler(request: Request) -> Response:
            response: Response = await endpoint(request, **request.path_params)
            return response

        return handler


class V2Route(RawRoute):
    """A :class:`RawRoute` that answers every request error as ``{"error": message}``, never problem+json."""

    def get_route_handler(self) -> Handler:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            try:
                return await handler(request)
            except V2_ERRORS as exc:
                response = v2_error(exc)
                assert response is not None
                return response

        return route
