"""The Open Inference Protocol's (and Triton's) extensions this server does not serve, and the one answer both
front ends give a client that reaches for one: REST 404 with the protocol's ``{"error": ...}``, gRPC
``UNIMPLEMENTED``, the same words (it used to be a bare ``{"error":"Not Found"}`` over REST and gRPC's "Method
not found!"). The extensions it does serve are :data:`~service.dataplane.models.EXTENSIONS`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Unsupported:
    """One extension: its name, why a client reaches for it, the REST paths and the gRPC methods it has."""

    name: str
    instead: str
    """What this server offers in its place."""
    rest: tuple[tuple[str, str], ...]
    """(method, path template under /v2) pairs."""
    grpc: tuple[str, ...]
    """Methods of ``inference.GRPCInferenceService``."""

    def message(self) -> str:
        return f"this server does not support the {self.name} extension of the Open Inference Protocol; {self.instead}"


FIXED_MODELS = "its models are fixed (GET /v2 lists its extensions, GET /v2/models/<name> describes each model)"
UNSUPPORTED = (
    Unsupported(
        "model repository",
        FIXED_MODELS,
        (
            ("POST", "/repository/index"),
            ("POST", "/repository/models/{model_name}/load"),
            ("POST", "/repository/models/{model_name}/unload"),
        ),
        ("RepositoryIndex", "RepositoryModelLoad", "RepositoryModelUnload"),
    ),
    Unsupported(
        "model configuration",
        "a model's inputs, outputs and parameters are in its metadata (GET /v2/models/<name>, gRPC ModelMetadata)",
        (("GET", "/models/{model_name}/config"), ("GET", "/models/{model_name}/versions/{model_version}/config")),
        ("ModelConfig",),
    ),
    Unsupported(
        "shared memory",
        "send tensors in the request (binary tensor data over REST, raw contents over gRPC)",
        tuple(
            (method, f"/{kind}sharedmemory{path}")
            for kind in ("system", "cuda")
            for method, path in (
                ("GET", "/status"),
                ("GET", "/region/{region_name}/status"),
                ("POST", "/region/{region_name}/register"),
                ("POST", "/region/{region_name}/unregister"),
                ("POST", "/unregister"),
            )
        ),
        tuple(f"{kind}SharedMemory{op}" for kind in ("System", "Cuda") for op in ("Status", "Register", "Unregister")),
    ),
    Unsupported(
        "trace",
        "traces are OpenTelemetry's (ATTN_TRACING), request ids are in the logs",
        (
            ("GET", "/trace/setting"),
            ("POST", "/trace/setting"),
            ("GET", "/models/{model_name}/trace/setting"),
            ("POST", "/models/{model_name}/trace/setting"),
        ),
        ("TraceSetting",),
    ),
    Unsupported(
        "logging",
        "the log level and format are settings (ATTN_LOG_LEVEL, ATTN_LOG_FORMAT)",
        (("GET", "/logging"), ("POST", "/logging")),
        ("LogSettings",),
    ),
)
"""Every extension a Triton client may reach for that this server does not serve."""
