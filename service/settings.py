"""Service settings, read from the environment with the prefix ``ATTN_``.

Every limit the service enforces is here with a safe default. Each field's description is its documentation:
docs/reference/settings.md is generated from this class (docs/hooks/reference.py).
"""

from __future__ import annotations

import difflib
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import NoDecode

from service.compute_settings import ComputeSettings
from service.core.diagnostics import DiagnosticThresholds

MIN_API_KEY_LENGTH = 16
_ORIGIN = re.compile(r"https?://[A-Za-z0-9.\-\[\]:]+")


ENV_PREFIX = "ATTN_"


def unknown_env_names(environ: Mapping[str, str], fields: set[str]) -> list[str]:
    """One message per ``ATTN_*`` variable that names no setting, with the closest valid name (difflib).

    pydantic-settings would ignore such a variable: a mistyped limit silently keeps its default.
    Names are compared case-insensitively, as pydantic-settings reads them.
    """
    valid = sorted(ENV_PREFIX + name.upper() for name in fields)
    problems = []
    for name in sorted(environ):
        upper = name.upper()
        if not upper.startswith(ENV_PREFIX) or upper in valid:
            continue
        close = difflib.get_close_matches(upper, valid, n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]}?)" if close else " (docs/reference/settings.md lists them)"
        problems.append(f"{name} is not a setting{hint}")
    return problems


class Settings(ComputeSettings):
    """All configuration of one service process (env prefix ``ATTN_``): :class:`ComputeSettings`'s fields, then
    the HTTP hardening and gRPC ones, and the checks across them.
    """

    # HTTP hardening (service/http/edge; docs/operations/production.md)
    max_body_bytes: int = Field(
        32 << 20, ge=1024, description="Largest request body on the wire, in bytes (413 before it is read in full)."
    )
    request_timeout_s: float = Field(
        30.0, gt=0, le=3600, description="Time limit of one request, queue wait included (504 at the deadline)."
    )
    max_concurrent_requests: int = Field(
        2,
        ge=1,
        le=1024,
        description="Compute slots per worker process: requests doing CPU work at once (uploads hold none). Each "
        "request's engine already uses every core, so about one slot per core is best: more slots only make the "
        "threads contend for the interpreter and the cores (measured: 2 slots gave 1.2x the goodput of 8 on 2 cores).",
    )
    max_queued_requests: int = Field(
        256,
        ge=0,
        le=4096,
        description="Admitted requests that may wait for a compute slot; past it, 503 with Retry-After at once.",
    )
    queue_target_s: float = Field(
        5.0,
        gt=0,
        description="Admission target: a request is admitted while its expected wait for a compute slot "
        "(requests ahead x recent service time per slot) stays under this (and under ATTN_QUEUE_TIMEOUT_S); "
        "else 503 before its body is read.",
    )
    queue_timeout_s: float = Field(
        10.0, gt=0, description="Longest wait of an admitted request for a compute slot before a 503 with Retry-After."
    )
    retry_after_s: int = Field(
        1, ge=1, le=3600, description="Smallest Retry-After (seconds) of 503 overload answers (else the expected wait)."
    )
    body_timeout_s: float = Field(
        10.0,
        gt=0,
        description="The request body must arrive within this time plus one second per ATTN_MIN_UPLOAD_BYTES_PER_S "
        "bytes received (408 and the connection closed past it).",
    )
    min_upload_bytes_per_s: float = Field(
        65536, gt=0, description="Slowest sustained upload accepted after the first ATTN_BODY_TIMEOUT_S (bytes/s)."
    )
    max_header_bytes: int = Field(
        16384,
        ge=1024,
        description="Largest request line plus headers, in bytes, counted before they are parsed whatever arrives "
        "in one read (431 and the connection closed).",
    )
    header_timeout_s: float = Field(
        10.0,
        gt=0,
        description="A connection must send a request's complete headers within this time, else it is closed.",
    )
    keep_alive_timeout_s: float = Field(
        5.0, gt=0, description="An idle keep-alive connection (no request after the last answer) is closed after this."
    )
    send_timeout_s: float = Field(
        30.0,
        gt=0,
        description="A client that reads none of its answer for this long is disconnected and the answer freed.",
    )
    max_connections: int = Field(
        1024,
        ge=1,
        le=1 << 20,
        description="Open connections per worker process; past it a new connection is answered 503 (Retry-After) "
        "and closed. Lowered at start to what RLIMIT_NOFILE leaves (serve raises the soft limit as far as the hard "
        "one allows).",
    )
    linger_time_s: float = Field(
        10.0,
        gt=0,
        description="After an answer sent before the request's body arrived in full (Connection: close), how long "
        "in all the rest of the body is read and discarded before the connection closes (nginx's lingering_time).",
    )
    linger_timeout_s: float = Field(
        2.0,
        gt=0,
        description="... and how long without a byte of it (nginx's lingering_timeout).",
    )
    linger_max_bytes: int = Field(
        64 << 20,
        ge=0,
        description="... and how many bytes of it at most.",
    )
    # gRPC (the Open Inference Protocol's gRPC form, beside REST in the same process; service/grpc)
    grpc_enabled: bool = Field(True, description="Serve gRPC (inference.GRPCInferenceService) beside REST.")
    grpc_port: int = Field(
        8001, ge=0, le=65535, description="gRPC port, on ATTN_HOST (Triton's default, 8001; serve's --grpc-port)."
    )
    grpc_keepalive_time_s: float = Field(
        60.0, gt=0, description="Ping a client whose connection has been quiet this long (HTTP/2 keepalive)."
    )
    grpc_keepalive_timeout_s: float = Field(
        20.0, gt=0, description="Close a connection whose keepalive ping is not answered within this time."
    )
    grpc_min_client_ping_interval_s: float = Field(
        10.0,
        gt=0,
        description="The most often a client may ping (closer pings end its connection with ENHANCE_YOUR_CALM).",
    )
    grpc_max_connection_idle_s: float = Field(
        300.0, gt=0, description="Close a connection with no call for this long (the client reconnects when needed)."
    )
    grpc_max_connection_age_s: float = Field(
        0.0,
        ge=0,
        description="Ask clients to reconnect after this long, so that load balancers spread long-lived clients "
        "(0: never).",
    )
    grpc_max_concurrent_rpcs: int = Field(
        256,
        ge=0,
        le=65536,
        description="Inference calls (ModelInfer, ModelMetadata, ModelReady, ServerMetadata) served at once per worker "
        "process; past it a call is refused RESOURCE_EXHAUSTED with retry-after before its message is read (0: no "
        "limit). Probes and long-lived streams have caps of their own, so neither class can shut the other out.",
    )
    grpc_max_concurrent_probes: int = Field(
        64,
        ge=1,
        le=65536,
        description="Probe calls (grpc.health.v1.Health/Check, ServerLive, ServerReady) served at once per worker "
        "process; past it RESOURCE_EXHAUSTED with retry-after. A probe answers in well under a millisecond once "
        "its message is in, and its message must arrive within one second.",
    )
    grpc_max_concurrent_streams: int = Field(
        32,
        ge=1,
        le=65536,
        description="Long-lived streams (health Watch, server reflection) open at once per worker process; past it "
        "RESOURCE_EXHAUSTED with retry-after.",
    )
    grpc_max_streams_per_connection: int = Field(
        100,
        ge=1,
        le=65536,
        description="Calls of one connection served at once per worker process (100: the most concurrent streams "
        "HTTP/2 asks a peer to allow at least); past it RESOURCE_EXHAUSTED with retry-after, before the message is "
        "read.",
    )
    api_keys: Annotated[list[SecretStr] | None, NoDecode] = Field(
        None, description="API keys; unset: no authentication. Each >= 16 characters."
    )
    auth_exempt_paths: Annotated[list[str], NoDecode] = Field(
        [
            "/healthz",
            "/readyz",
            "/metrics",
            "/v2/health/live",
            "/v2/health/ready",
            "/inference.GRPCInferenceService/ServerLive",
            "/inference.GRPCInferenceService/ServerReady",
            "/grpc.health.v1.Health/Check",
            "/grpc.health.v1.Health/Watch",
            "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
        ],
        description="REST paths and gRPC methods (/package.Service/Method) served without an API key: the probes "
        "of both protocols, the metrics scrape and server reflection (none holds data). Remove one to require a "
        "key for it.",
    )
    pages_public: bool = Field(
        True,
        description="With API keys set, serve the pages that hold no data without a key: the playground (/ and "
        "/playground/*), /docs, /redoc and /openapi.json. false: they need a key like the API.",
    )
    cors_allow_origins: Annotated[list[str], NoDecode] = Field(
        [], description="Origins allowed by CORS (e.g. https://app.example.com); empty: no CORS headers at all."
    )
    cors_allow_credentials: bool = Field(
        False, description="Let browsers send credentials cross-origin (never with '*')."
    )
    metrics_dir: Path | None = Field(
        None,
        description="prometheus-client multiprocess directory (PROMETHEUS_MULTIPROC_DIR); required when workers > 1, "
        "with 4 MiB free per worker and one more (checked at start: serve exits 2 with the reason).",
    )
    log_format: Literal["json", "text"] = Field(
        "json",
        description="Log lines as JSON objects or plain text (control characters escaped as \\xHH, one line per "
        "record; a value with a space, '=' or '\"' quoted as logfmt does).",
    )
    tracing: bool = Field(
        False,
        description="OpenTelemetry tracing (needs the 'tracing' extra): a span per request, continuing the "
        "caller's traceparent, with decode, engine and encode spans; exported over OTLP (OTEL_* variables).",
    )
    shutdown_grace_s: float = Field(
        30.0,
        ge=0,
        description="On SIGTERM, how long requests in flight may take to finish; those still running then are "
        "answered 503 with Retry-After and Connection: close (gRPC calls: UNAVAILABLE with retry-after).",
    )
    debug_delay_s: float = Field(
        0.0,
        ge=0,
        le=60,
        description="TEST ONLY: sleep this long in every admitted request (tests of shutdown and backpressure); "
        "keep 0.",
    )

    @field_validator("api_keys", "auth_exempt_paths", "cors_allow_origins", mode="before")
    @classmethod
    def _split_list(cls, value: Any) -> Any:
        """These lists come from the environment as a JSON list or comma-separated."""
        if not isinstance(value, str):
            return value
        text = value.strip()
        if text.startswith("["):
            return json.loads(text)
        return [item.strip() for item in text.split(",")] if text else []

    @field_validator("cost_calibration")
    @classmethod
    def _calibration(cls, value: str) -> str:
        """'auto', 'off', or kernel=factor pairs that the cost model takes."""
        text = value.strip()
        if text.lower() in ("auto", "off"):
            return text.lower()
        from service.engines.calibration import parse_factors

        parse_factors(text)  # ValueError names what is wrong
        return text

    def cost_factors(self) -> dict[str, float] | None:
        """The calibration factors given explicitly (None for 'auto' and 'off')."""
        if self.cost_calibration in ("auto", "off"):
            return None
        from service.engines.calibration import parse_factors

        return parse_factors(self.cost_calibration)

    @model_validator(mode="after")
    def _refuse_unsafe(self) -> Settings:
        """Refuse to start on a setting that would silently weaken the service, or an unknown ATTN_* name."""
        problems = unknown_env_names(os.environ, set(type(self).model_fields))
        if self.api_keys is not None:
            if not self.api_keys:
                problems.append("ATTN_API_KEYS is set but holds no key; unset it to run without authentication")
            for i, key in enumerate(self.api_keys):
                if len(key.get_secret_value()) < MIN_API_KEY_LENGTH:
                    problems.append(
                        f"ATTN_API_KEYS: key #{i + 1} has {len(key.get_secret_value())} characters; "
                        f"keys must have at least {MIN_API_KEY_LENGTH}"
                    )
        for path in self.auth_exempt_paths:
            if not path.startswith("/"):
                problems.append(f"ATTN_AUTH_EXEMPT_PATHS: {path!r} is not a path (it must start with /)")
        for origin in self.cors_allow_origins:
            if origin != "*" and not _ORIGIN.fullmatch(origin):
                problems.append(f"ATTN_CORS_ALLOW_ORIGINS: {origin!r} is not an origin (scheme://host[:port], no path)")
        if "*" in self.cors_allow_origins and self.cors_allow_credentials:
            problems.append(
                "ATTN_CORS_ALLOW_ORIGINS='*' with ATTN_CORS_ALLOW_CREDENTIALS=true lets any site act as the user"
            )
        if self.workers > 1 and self.metrics_dir is None and not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            problems.append("ATTN_WORKERS > 1 needs ATTN_METRICS_DIR (a directory for multiprocess metrics)")
        if self.grpc_enabled and self.grpc_port and self.grpc_port == self.port:
            problems.append("ATTN_GRPC_PORT must differ from ATTN_PORT (or set ATTN_GRPC_ENABLED=false)")
        if self.queue_timeout_s >= self.request_timeout_s:
            problems.append("ATTN_QUEUE_TIMEOUT_S must be shorter than ATTN_REQUEST_TIMEOUT_S")
        if self.max_body_bytes > self.memory_budget_bytes:
            # A body the memory budget can never hold would be read in full and then refused; keeping the body
            # limit inside the budget makes the header check (413 before reading) cover it.
            problems.append("ATTN_MAX_BODY_BYTES must not exceed ATTN_MEMORY_BUDGET_BYTES")
        if self.body_memory_bytes and not self.max_body_bytes <= self.body_memory_bytes <= self.memory_budget_bytes:
            problems.append(
                "ATTN_BODY_MEMORY_BYTES must lie between ATTN_MAX_BODY_BYTES and ATTN_MEMORY_BUDGET_BYTES (or be 0)"
            )
        if problems:
            raise ValueError("unsafe settings: " + "; ".join(problems))
        return self

    def body_memory_limit(self) -> int:
        """``body_memory_bytes``, or its default: half the memory budget, at least the largest body."""
        return self.body_memory_bytes or max(self.max_body_bytes, self.memory_budget_bytes // 2)

    def diagnostic_thresholds(self) -> DiagnosticThresholds:
        """The diagnostics thresholds as the core expects them."""
        return DiagnosticThresholds(
            collapsed_max_weight=self.diag_collapsed_max_weight,
            collapsed_row_fraction=self.diag_collapsed_row_fraction,
            uniform_normalized_entropy=self.diag_uniform_normalized_entropy,
            saturation_margin=self.diag_saturation_margin,
        )
