"""Plain Starlette routes in front of the data plane's FastAPI routes: the same endpoints, less work per request.

FastAPI (0.165) matches a request against the routes of each included router
twice (once to pick the router, once inside it), each candidate with some
bookkeeping of its own, and solves an endpoint's dependencies even when the
only one is the ``Request``: together about 30 us (``/v1``) to 50 us (``/v2``
inference, deeper in the list and with a path parameter) of a tiny request
that computes in about 100 us. The hot endpoints already take the raw
``Request`` and parse and validate their bodies themselves, so they are also
registered here as plain Starlette routes, first in the app's route list. The
FastAPI routes stay: they give the OpenAPI schema, and a request they would
match is answered the same way (same endpoint functions, same error answers:
the app's exception handlers for ``/v1``, ``{"error": ...}`` for ``/v2``).
"""

from __future__ import annotations

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from service.api import v1, v2


async def _infer(request: Request) -> Response:
    """Both inference paths: with and without ``/versions/{model_version}``."""
    params = request.path_params
    return await v2.infer_route(request, params["model_name"], params.get("model_version"))


_infer_answering_errors = v2.answering_errors(_infer)  # as v2.V2Route wraps the FastAPI routes

FAST_ROUTES = (
    Route("/v1/attention", v1.post_attention, methods=["POST"], include_in_schema=False),
    Route("/v1/softmax", v1.post_softmax, methods=["POST"], include_in_schema=False),
    Route("/v2/models/{model_name}/infer", _infer_answering_errors, methods=["POST"], include_in_schema=False),
    Route(
        "/v2/models/{model_name}/versions/{model_version}/infer",
        _infer_answering_errors,
        methods=["POST"],
        include_in_schema=False,
    ),
)


def install_fast_routes(app: FastAPI) -> None:
    """Put :data:`FAST_ROUTES` first in ``app``'s routes (call after the routers are included)."""
    app.router.routes[0:0] = FAST_ROUTES
