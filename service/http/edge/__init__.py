"""The edge of the REST front end: what every HTTP request meets before its route, and the connection limits.

- ``layer``: :class:`~service.http.edge.layer.ServiceMiddleware`, one pure-ASGI pass: request id,
  API key, body limits, deadline, metrics, access log, security headers, and the 499/500 answers
  (admission and the body's memory are the data plane's door's, which the inference routes enter);
- ``exchange``: one request's state in that pass, and what every exchange reads (:class:`~.exchange.Edge`);
- ``requests``: request ids, probes, route templates (the metrics' labels), refusals in the path's format;
- ``security``: security headers and CORS;
- ``protocol``: the connection's own limits (header size and time, send timeout, lingering close), in
  uvicorn's protocol; ``connections``: the cap on open connections and the refusals written to the socket;
  ``cycle``: how an answer is written (its head with the first body chunk);
- ``openapi``: the edge's answers in the OpenAPI schema.
"""

from __future__ import annotations

from fastapi import FastAPI

from service.dataplane.plane import DataPlane
from service.http.edge.exchange import Limits
from service.http.edge.layer import ServiceMiddleware
from service.http.edge.openapi import document_error_responses
from service.observability.metrics import ServiceMetrics
from service.settings import Settings

CORS_HEADERS = ["Authorization", "Content-Type", "Content-Encoding", "Accept-Encoding", "X-API-Key", "X-Request-ID"]


def install_edge(app: FastAPI, plane: DataPlane, metrics: ServiceMetrics, settings: Settings) -> None:
    """Add the edge's middleware (with Starlette's CORS inside it when ``ATTN_CORS_ALLOW_ORIGINS`` is set) and
    document its answers in the schema. Call after the routes are installed.
    """
    cors = None
    if settings.cors_allow_origins:
        cors = {
            "allow_origins": settings.cors_allow_origins,
            "allow_credentials": settings.cors_allow_credentials,
            "allow_methods": ["GET", "POST"],
            "allow_headers": CORS_HEADERS,
            "expose_headers": ["X-Request-ID", "Retry-After"],
        }
    app.add_middleware(
        ServiceMiddleware,
        plane=plane,
        metrics=metrics,
        limits=Limits(
            max_body_bytes=settings.max_body_bytes,
            request_timeout_s=settings.request_timeout_s,
            body_timeout_s=settings.body_timeout_s,
            min_upload_bytes_per_s=settings.min_upload_bytes_per_s,
            retry_after_s=settings.retry_after_s,
        ),
        public_pages=settings.pages_public,
        cors=cors,
    )
    document_error_responses(app, settings)
