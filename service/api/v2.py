"""The Open Inference Protocol (KServe V2, as Triton and MLServer speak it) over REST, under /v2.

Two models, ``attention`` and ``softmax``, run the same code as ``/v1/attention``
and ``/v1/softmax`` (the option types, :func:`service.api.v1.attention_task`,
the engine dispatcher, diagnostics); only the wire form differs:

- tensors are protocol inputs and outputs, as JSON ``data`` or binary
  (:mod:`service.api.v2_tensors`, the binary tensor data extension);
- the scalar options (``normalizer``, ``alpha``, ``causal``, ``scale``,
  ``temperature``, ``engine``, ...) are request ``parameters``;
- diagnostics, the engine that ran and the timings come back in the response
  ``parameters``: ``diagnostics`` and ``timing_ms`` as JSON text (protocol
  parameters are scalars), ``engine``, ``engine_provider``, ``engine_reason``
  as strings.

Errors are the protocol's ``{"error": "..."}``: 400 for anything wrong with
the request (malformed or invalid; /v1 answers 422 for the latter), 404 for an
unknown model or version, 413 over a size or work limit, 415 for an unknown
Content-Encoding, 503 while the model is not ready (with ``Retry-After``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
from fastapi import APIRouter, Request
from fastapi.routing import APIRoute
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from service import __version__
from service.api import gradients, v1
from service.api.codecs import TensorLimits
from service.api.errors import ProblemError, protocol_error_response
from service.api.gradient_schemas import AttentionBackwardRequest
from service.api.schemas import AttentionOptions, SoftmaxOptions
from service.api.v2_tensors import (
    HEADER_LENGTH,
    PROTOCOL_PARAMETERS,
    InferRequest,
    TensorSpec,
    bad,
    encode_response,
    parse_request,
    split_body,
)
from service.api.wire import JSON_OPTIONS, _fallback, read_body, run_cpu
from service.core.errors import InvalidInput, NumericalError
from service.runtime import Runtime

SERVER_NAME = "attention-service"
EXTENSIONS = ["binary_tensor_data", "parameters"]
MODEL_VERSION = "1"
PLATFORM = "attention_service"

ERROR_SCHEMA = {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}}}


REQUEST_ERRORS = (ProblemError, InvalidInput, NumericalError, StarletteHTTPException)
"""What a request can be refused with; anything else is a bug, left to the app's 500 handling."""


def error_response(exc: ProblemError | InvalidInput | NumericalError | StarletteHTTPException) -> Response:
    if isinstance(exc, ProblemError):
        # /v1's 422 (invalid input) is the protocol's 400; other statuses keep their meaning.
        return protocol_error_response(400 if exc.status == 422 else exc.status, exc.detail, exc.headers)
    if isinstance(exc, InvalidInput):  # its message names the field
        return protocol_error_response(400, exc.message)
    if isinstance(exc, NumericalError):
        return protocol_error_response(400, str(exc))
    # An HTTPException, e.g. the body-size limit raised while the body is read.
    return protocol_error_response(exc.status_code, exc.detail if isinstance(exc.detail, str) else "error", exc.headers)


Handler = Callable[[Request], Coroutine[Any, Any, Response]]


def answering_errors(handler: Handler) -> Handler:
    """``handler`` with every request error answered as the protocol's ``{"error": message}``."""

    async def route(request: Request) -> Response:
        try:
            return await handler(request)
        except REQUEST_ERRORS as exc:
            return error_response(exc)

    return route


class V2Route(APIRoute):
    """Answers every error of a /v2 route as ``{"error": message}``, never problem+json."""

    def get_route_handler(self) -> Handler:
        return answering_errors(super().get_route_handler())


# --------------------------------------------------------------------------- models


@dataclass(frozen=True, slots=True)
class Model:
    """One model of the /v2 API: its tensors, its parameters, and how it runs."""

    name: str
    description: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    default_outputs: tuple[str, ...]
    parameters: Mapping[str, str]
    """Request parameters this model reads, with their meaning."""
    run: Callable[[Runtime, InferRequest], tuple[list[tuple[str, np.ndarray]], dict[str, Any]]]
    limits: Callable[[Runtime], TensorLimits] | None = None
    """Size limits of the inputs; default: the settings' (``v1._limits``)."""

    def metadata(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "versions": [MODEL_VERSION],
            "platform": PLATFORM,
            "description": self.description,
            "inputs": [s.metadata() for s in self.inputs],
            "outputs": [s.metadata() for s in self.outputs],
            "parameters": dict(self.parameters),
        }


FLOAT = ("FP32", "FP64")
MASK = ("BOOL", "FP32", "FP64")
COMMON_PARAMETERS = {
    "normalizer": "string: softmax (default), sparsemax, entmax15, entmax (needs alpha), relu",
    "alpha": "number > 1, for normalizer entmax",
    "temperature": "number > 0 (default 1); divides the masked scores (a float mask too)",
    "diagnostics": "bool (default true): return diagnostics in the response parameters",
    "binary_data_output": "bool (default false): return every output not listed otherwise as binary data",
}


def _precision(request: InferRequest, names: Sequence[str]) -> str:
    """The compute precision: FP64 inputs compute in float64, FP32 in float32; the inputs must agree."""
    types = {request.datatypes[n] for n in names}
    if len(types) > 1:
        raise bad(f"inputs {', '.join(names)} must share one datatype, got {', '.join(sorted(types))}")
    return "float64" if types == {"FP64"} else "float32"


def _options(request: InferRequest, model: Model, mapping: Mapping[str, str]) -> dict[str, Any]:
    """The request parameters as /v1 request fields; unknown parameters are rejected (a typo is not a default)."""
    out: dict[str, Any] = {}
    for key, value in request.parameters.items():
        if key in mapping:
            out[mapping[key]] = value
        elif key not in PROTOCOL_PARAMETERS and key != "diagnostics" and not key.startswith("triton_"):
            raise bad(f"model {model.name!r} has no parameter {key!r}; it takes {', '.join(model.parameters)}")
    return out


def _validate(schema: type[BaseModel], fields: dict[str, Any], model: Model) -> Any:
    """Validate the request parameters once (the /v1 option types), naming the offending parameter the /v2 way."""
    try:
        return v1._validate(schema, fields)
    except ProblemError as exc:
        parts = []
        for err in exc.errors or []:
            loc = [str(p) for p in err["loc"]]
            field = loc[0] if loc else ""
            kind = "input" if any(s.name == field for s in model.inputs) else "parameter"
            where = f"{kind} {field!r}" + ("".join(f"[{p}]" for p in loc[1:]))
            parts.append(f"{where}: {err['msg']}")
        raise bad("; ".join(parts) or exc.detail) from None


def _diagnostics_parameters(body: dict[str, Any], wanted: bool) -> dict[str, Any]:
    params: dict[str, Any] = {}
    engine = body.get("engine")
    if engine:
        params.update(engine=engine["name"], engine_provider=engine["provider"], engine_reason=engine["reason"])
    if wanted and "diagnostics" in body:
        params["diagnostics"] = orjson.dumps(body["diagnostics"], option=JSON_OPTIONS, default=_fallback).decode()
    params["timing_ms"] = orjson.dumps(body["timing_ms"]).decode()
    return params


def _flag(request: InferRequest, name: str, default: bool) -> bool:
    value = request.parameters.get(name, default)
    if not isinstance(value, bool):
        raise bad(f"parameter {name!r} must be true or false")
    return value


ATTENTION_PARAMETERS = {
    **COMMON_PARAMETERS,
    "causal": 'false (default), true (= top_left), "top_left", "bottom_right"',
    "scale": "number > 0 (default 1/sqrt(E))",
    "engine": "string: auto (default), numpy, onnx",
}
_ATTENTION_FIELDS = {k: k for k in ("normalizer", "alpha", "temperature", "causal", "scale", "engine")}


def _run_attention(runtime: Runtime, request: InferRequest) -> tuple[list[tuple[str, np.ndarray]], dict[str, Any]]:
    t0 = time.perf_counter()
    wanted_outputs = list(request.outputs) if request.outputs_given else list(ATTENTION.default_outputs)
    with_diagnostics = _flag(request, "diagnostics", True)
    options = _validate(AttentionOptions, _options(request, ATTENTION, _ATTENTION_FIELDS), ATTENTION)
    returned = wanted_outputs + (["diagnostics"] if with_diagnostics else [])
    precision = _precision(request, ("query", "key", "value"))
    inputs = request.inputs
    task = v1.attention_task(
        runtime,
        query=inputs["query"],
        key=inputs["key"],
        value=inputs["value"],
        mask=inputs.get("mask"),
        key_lengths=inputs.get("key_lengths"),
        options=options,
        precision=precision,
        returned=returned,
        encoding="json",
    )
    body = v1.compute_attention(runtime, task, options.engine, returned, precision, "json", t0)
    return [(name, body[name]) for name in wanted_outputs], _diagnostics_parameters(body, with_diagnostics)


ATTENTION = Model(
    name="attention",
    description=(
        "Scaled dot-product attention (semantics.md): scores = scale * Q K^T, plus the mask bias, divided by the "
        "temperature, normalized over the keys, output = A V. query (B, Hq, L, E), key (B, Hkv, S, E), value "
        "(B, Hkv, S, Ev); ranks 2 and 3 mean leading axes of size 1. FP64 inputs compute in float64."
    ),
    inputs=(
        TensorSpec("query", FLOAT, description="(B, Hq, L, E), (H, L, E) or (L, E)"),
        TensorSpec("key", FLOAT, description="(B, Hkv, S, E) with Hq % Hkv == 0; the query's datatype"),
        TensorSpec("value", FLOAT, description="(B, Hkv, S, Ev); the query's datatype"),
        TensorSpec(
            "mask",
            MASK,
            min_rank=1,
            optional=True,
            description="BOOL (true = may attend) or additive float, broadcastable to (B, Hq, L, S)",
        ),
        TensorSpec(
            "key_lengths",
            ("INT64",),
            min_rank=1,
            max_rank=1,
            optional=True,
            description="(B,): key j of batch b is valid iff j < key_lengths[b]",
        ),
    ),
    outputs=(
        TensorSpec("output", FLOAT, description="the query's shape with Ev last"),
        TensorSpec("weights", FLOAT, description="query.shape[:-1] + (S,)"),
        TensorSpec(
            "scores", FLOAT, description="normalizer input (scale*QK^T + bias)/T, masked = -inf; only when requested"
        ),
    ),
    default_outputs=("output", "weights"),
    parameters=ATTENTION_PARAMETERS,
    run=_run_attention,
)


SOFTMAX_PARAMETERS = {
    **COMMON_PARAMETERS,
    "axis": "integer (default -1): the axis normalized over",
    "log": "bool: also return log_probabilities (softmax only); implied when log_probabilities is requested",
}
_SOFTMAX_FIELDS = {k: k for k in ("normalizer", "alpha", "temperature", "axis", "log")}


def _run_softmax(runtime: Runtime, request: InferRequest) -> tuple[list[tuple[str, np.ndarray]], dict[str, Any]]:
    with_diagnostics = _flag(request, "diagnostics", True)
    fields = _options(request, SOFTMAX, _SOFTMAX_FIELDS)
    if request.outputs_given:
        wanted_outputs = list(request.outputs)
        if "log_probabilities" in wanted_outputs and "log" not in fields:
            fields["log"] = True
    else:
        wanted_outputs = ["probabilities"] + (["log_probabilities"] if fields.get("log") is True else [])
    options = _validate(SoftmaxOptions, fields, SOFTMAX)
    precision = _precision(request, ("logits",))
    body = v1.compute_softmax(runtime, request.inputs["logits"], request.inputs.get("mask"), options, precision, "json")
    missing = [n for n in wanted_outputs if n not in body]
    if missing:
        raise bad(f"output {missing[0]!r} needs parameter log = true")
    return [(name, body[name]) for name in wanted_outputs], _diagnostics_parameters(body, with_diagnostics)


SOFTMAX = Model(
    name="softmax",
    description="Normalizes logits along one axis: (logits + float mask) / temperature, then the normalizer; "
    "a BOOL mask removes positions.",
    inputs=(
        TensorSpec("logits", FLOAT, min_rank=1, description="any rank 1 to 4"),
        TensorSpec(
            "mask",
            MASK,
            min_rank=1,
            optional=True,
            description="BOOL (true = keep) or additive float, broadcastable to the logits",
        ),
    ),
    outputs=(
        TensorSpec("probabilities", FLOAT, min_rank=1, description="the logits' shape"),
        TensorSpec("log_probabilities", FLOAT, min_rank=1, description="softmax only; masked = -inf"),
    ),
    default_outputs=("probabilities",),
    parameters=SOFTMAX_PARAMETERS,
    run=_run_softmax,
)

BACKWARD_PARAMETERS = {
    **{k: v for k, v in ATTENTION_PARAMETERS.items() if k != "diagnostics"},
    "grad_scale": "bool (default false): return the derivative with respect to the scale in the response parameters",
    "grad_temperature": "bool (default false): return the derivative with respect to the temperature likewise",
    "gradient_health": "bool (default false): return the per-head gradient health (JSON text) likewise",
}
_BACKWARD_FLAGS = ("grad_scale", "grad_temperature", "gradient_health")


def _run_attention_backward(
    runtime: Runtime, request: InferRequest
) -> tuple[list[tuple[str, np.ndarray]], dict[str, Any]]:
    wanted_outputs = list(request.outputs) if request.outputs_given else list(ATTENTION_BACKWARD.default_outputs)
    flags = [name for name in _BACKWARD_FLAGS if _flag(request, name, False)]
    fields = _options(request, ATTENTION_BACKWARD, {**_ATTENTION_FIELDS, **{f: f for f in _BACKWARD_FLAGS}})
    for name in _BACKWARD_FLAGS:
        fields.pop(name, None)
    tensors = ("query", "key", "value", "mask", "grad_output", "grad_weights")
    fields.update({name: request.inputs[name] for name in tensors if name in request.inputs})
    if "key_lengths" in request.inputs:
        fields["key_lengths"] = request.inputs["key_lengths"].tolist()
    floats = ("query", "key", "value", "grad_output") + (("grad_weights",) if "grad_weights" in request.inputs else ())
    fields["precision"] = _precision(request, floats)
    fields["return"] = wanted_outputs + flags
    req = _validate(AttentionBackwardRequest, fields, ATTENTION_BACKWARD)
    body = gradients.compute_backward(runtime, req)
    params = _diagnostics_parameters(body, False)
    for name in ("grad_scale", "grad_temperature"):
        if name in body:
            params[name] = body[name]
    if "gradient_health" in body:
        params["gradient_health"] = orjson.dumps(body["gradient_health"]).decode()
    return [(name, body[name]) for name in wanted_outputs], params


ATTENTION_BACKWARD = Model(
    name="attention_backward",
    description=(
        "The backward pass of model attention (semantics.md, Gradients): the gradients of "
        "sum(output * grad_output) + sum(weights * grad_weights) with respect to query, key and value (key and "
        "value summed over the query heads sharing them), and on request of a float mask. Same inputs and "
        "parameters as attention, plus grad_output; FP64 inputs compute in float64."
    ),
    inputs=(
        *ATTENTION.inputs,
        TensorSpec("grad_output", FLOAT, description="the output's shape: query.shape[:-1] + (Ev,)"),
        TensorSpec(
            "grad_weights", FLOAT, optional=True, description="the weights' shape: query.shape[:-1] + (S,); optional"
        ),
    ),
    outputs=(
        TensorSpec("grad_query", FLOAT, description="the query's shape"),
        TensorSpec("grad_key", FLOAT, description="the key's shape"),
        TensorSpec("grad_value", FLOAT, description="the value's shape"),
        TensorSpec("grad_mask", FLOAT, min_rank=1, description="a float mask's shape; only when requested"),
        TensorSpec("output", FLOAT, description="the forward output; only when requested"),
        TensorSpec("weights", FLOAT, description="the forward weights; only when requested"),
    ),
    default_outputs=("grad_query", "grad_key", "grad_value"),
    parameters=BACKWARD_PARAMETERS,
    run=_run_attention_backward,
)

MODELS: dict[str, Model] = {m.name: m for m in (ATTENTION, SOFTMAX, ATTENTION_BACKWARD)}


# --------------------------------------------------------------------------- routes

router = APIRouter(prefix="/v2", tags=["open inference protocol"], route_class=V2Route)

ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"description": desc, "content": {"application/json": {"schema": ERROR_SCHEMA}}}
    for status, desc in (
        (400, "Malformed or invalid request"),
        (404, "Unknown model or version"),
        (413, "Request too large (body, inflated body, estimated work or response size)"),
        (415, "Unsupported Content-Encoding"),
        (503, "Model not ready"),
    )
}


def _runtime(request: Request) -> Runtime:
    runtime: Runtime = request.app.state.runtime
    return runtime


def _model(name: str, version: str | None) -> Model:
    model = MODELS.get(name)
    if model is None:
        raise ProblemError(404, f"unknown model {name!r}; this server has {', '.join(MODELS)}")
    if version is not None and version != MODEL_VERSION:
        raise ProblemError(404, f"model {name!r} has no version {version!r}; its versions are {MODEL_VERSION}")
    return model


def _not_ready(runtime: Runtime) -> str | None:
    """Why the server is not ready, or None when it is (``Runtime.readiness``)."""
    if runtime.startup_done.is_set() and all(engine.ready for engine in runtime.engines.values()):
        return None  # the usual case, checked on every inference request without building the details
    ready, details = runtime.readiness()
    if ready:
        return None
    if details.get("starting"):
        return "the engines are starting"
    waiting = [name for name, ok in details.get("engines", {}).items() if not ok]
    reason = f"engine {', '.join(waiting)} is not ready" if waiting else "not ready"
    return reason + (f" ({details['error']})" if details.get("error") else "")


@router.get("", summary="Server metadata: name, version, extensions")
async def server_metadata() -> Response:
    return Response(
        orjson.dumps({"name": SERVER_NAME, "version": __version__, "extensions": EXTENSIONS}),
        media_type="application/json",
    )


@router.get("/health/live", summary="Server liveness")
async def server_live() -> Response:
    return Response(b'{"live":true}', media_type="application/json")


@router.get(
    "/health/ready", summary="Server readiness (503 until every engine is ready)", responses={503: ERROR_RESPONSES[503]}
)
async def server_ready(request: Request) -> Response:
    reason = _not_ready(_runtime(request))
    if reason is None:
        return Response(b'{"ready":true}', media_type="application/json")
    return Response(
        orjson.dumps({"ready": False, "error": reason}),
        status_code=503,
        media_type="application/json",
        headers={"Retry-After": "5"},
    )


# HEAD on the health routes, like /healthz and /readyz (service/api/operations.py); not in the schema.
router.add_api_route("/health/live", server_live, methods=["HEAD"], include_in_schema=False)
router.add_api_route("/health/ready", server_ready, methods=["HEAD"], include_in_schema=False)


async def _model_ready(request: Request, model_name: str, model_version: str | None) -> Response:
    model = _model(model_name, model_version)
    reason = _not_ready(_runtime(request))
    body: dict[str, Any] = {"name": model.name, "ready": reason is None}
    if reason is None:
        return Response(orjson.dumps(body), media_type="application/json")
    body["error"] = f"model {model.name!r} is not ready: {reason}"
    return Response(orjson.dumps(body), status_code=503, media_type="application/json", headers={"Retry-After": "5"})


@router.get(
    "/models/{model_name}/ready", summary="Model readiness", responses={k: ERROR_RESPONSES[k] for k in (404, 503)}
)
async def model_ready(request: Request, model_name: str) -> Response:
    return await _model_ready(request, model_name, None)


@router.get(
    "/models/{model_name}/versions/{model_version}/ready",
    summary="Model readiness (one version)",
    responses={k: ERROR_RESPONSES[k] for k in (404, 503)},
)
async def model_version_ready(request: Request, model_name: str, model_version: str) -> Response:
    return await _model_ready(request, model_name, model_version)


@router.get(
    "/models/{model_name}",
    summary="Model metadata: inputs, outputs and parameters",
    responses={404: ERROR_RESPONSES[404]},
)
async def model_metadata(model_name: str) -> Response:
    return Response(orjson.dumps(_model(model_name, None).metadata()), media_type="application/json")


@router.get(
    "/models/{model_name}/versions/{model_version}",
    summary="Model metadata (one version)",
    responses={404: ERROR_RESPONSES[404]},
)
async def model_version_metadata(model_name: str, model_version: str) -> Response:
    return Response(orjson.dumps(_model(model_name, model_version).metadata()), media_type="application/json")


def _infer(runtime: Runtime, model: Model, body: bytes, header_length: str | None) -> tuple[bytes, dict[str, str], str]:
    """Parse, run and encode one inference request: all of its CPU work, run by ``run_cpu``."""
    obj, binary = split_body(body, header_length)
    request = parse_request(
        obj,
        binary,
        model=model.name,
        inputs=model.inputs,
        outputs=[s.name for s in model.outputs],
        limits=(model.limits or v1._limits)(runtime),
    )
    results, parameters = model.run(runtime, request)
    outputs = [(name, arr, request.outputs.get(name, request.binary_default)) for name, arr in results]
    return encode_response(
        model=model.name, version=MODEL_VERSION, request_id=request.id, parameters=parameters, outputs=outputs
    )


INFER_OPENAPI: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "description": (
            "An Open Inference Protocol inference request: {id?, parameters?, inputs: [{name, shape, datatype, "
            "parameters?, data?}], outputs?: [{name, parameters?}]}. With the binary tensor data extension the JSON is "
            "followed by the raw little-endian row-major tensors of the inputs that have parameters.binary_data_size, "
            "and the Inference-Header-Content-Length header gives the JSON's length. Content-Encoding gzip or deflate "
            "is accepted."
        ),
        "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/InferenceRequest"}},
            "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
        },
    },
    "parameters": [
        {
            "name": "Inference-Header-Content-Length",
            "in": "header",
            "required": False,
            "schema": {"type": "integer", "minimum": 1},
            "description": "Length of the JSON part when binary tensor data follows it.",
        }
    ],
}
INFER_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": (
            "The inference response {model_name, model_version, id?, parameters, outputs}; application/octet-stream "
            "with Inference-Header-Content-Length when any output is binary"
        ),
        "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/InferenceResponse"}},
            "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
        },
    },
    **{k: ERROR_RESPONSES[k] for k in (400, 404, 413, 415, 503)},
}


async def infer_route(request: Request, model_name: str, model_version: str | None) -> Response:
    model = _model(model_name, model_version)
    runtime = _runtime(request)
    reason = _not_ready(runtime)
    if reason is not None:
        raise ProblemError(503, f"model {model.name!r} is not ready: {reason}", headers={"Retry-After": "5"})
    body = await read_body(request, json_only=False)  # JSON or the binary extension's octet-stream
    content, headers, media_type = await run_cpu(
        request, len(body), _infer, runtime, model, body, request.headers.get(HEADER_LENGTH)
    )
    return Response(content, media_type=media_type, headers=headers)


@router.post("/models/{model_name}/infer", summary="Inference", responses=INFER_RESPONSES, openapi_extra=INFER_OPENAPI)
async def infer(request: Request, model_name: str) -> Response:
    """Run a model. JSON or binary tensors in and out; options in the request parameters; diagnostics in the response parameters."""  # noqa: E501 -- the docstring is the endpoint's OpenAPI description: one line keeps openapi.yaml as it is
    return await infer_route(request, model_name, None)


@router.post(
    "/models/{model_name}/versions/{model_version}/infer",
    summary="Inference (one version)",
    responses=INFER_RESPONSES,
    openapi_extra=INFER_OPENAPI,
)
async def infer_version(request: Request, model_name: str, model_version: str) -> Response:
    """As ``/v2/models/{model_name}/infer``, for an explicit version (``1``)."""
    return await infer_route(request, model_name, model_version)
