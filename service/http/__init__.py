"""The REST front end: decode HTTP requests, call the data plane, encode the answers.

- ``app``: :func:`~service.http.app.build_app`, the FastAPI app and its one route table;
- ``v1``: the JSON API (``/v1``);
- ``v2``: the Open Inference Protocol over REST (``/v2``);
- ``operations``: ``/healthz``, ``/readyz``, ``/v1/engines``, ``/v1/models``;
- ``edge``: what every request meets before its route (keys, limits, deadline, metrics, logs)
  and the connection limits;
- ``codecs``: JSON bodies and the /v1 tensor wire forms;
- ``bodies``: reading bodies (on the data plane's memory lease), inflating and parsing them;
- ``responses``: writing the answers: JSON from numpy with orjson, gzip for clients that accept it;
- ``errors``: the front end's own refusals (HTTP-level, invalid bodies, validation errors as field errors);
- ``error_responses``: problem+json and the protocol's error body, by kind of service error, and the handlers;
- ``routing``: routes documented by FastAPI and served without per-request dependency solving;
- ``docs``, ``examples``: the OpenAPI schema's extras and the offline /docs and /redoc pages;
- ``tracing``: OpenTelemetry spans per request (``ATTN_TRACING``).
"""
