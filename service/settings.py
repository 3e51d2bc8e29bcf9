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
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from service.core.diagnostics import DiagnosticThresholds
from service.models_location import default_models_dir

_DIAG = DiagnosticThresholds()


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


class Settings(BaseSettings):
    """All configuration of one service process (env prefix ``ATTN_``)."""

    # hide_input_in_errors: a refused setting must not echo API keys into logs.
    model_config = SettingsConfigDict(env_prefix="ATTN_", env_file=None, extra="ignore", hide_input_in_errors=True)

    # Server
    host: str = Field("127.0.0.1", description="Address the server binds (REST, and gRPC beside it).")
    port: int = Field(8000, ge=0, le=65535, description="REST port (serve's --port overrides it).")
    workers: int = Field(
        1,
        ge=1,
        le=64,
        description="Worker processes (uvicorn's); more than one needs ATTN_METRICS_DIR, and each worker takes "
        "connections only once its engines are warm.",
    )
    log_level: Literal["critical", "error", "warning", "info", "debug"] = Field(
        "info", description="Lowest level logged; requests are logged at info, probes and scrapes at debug."
    )
    gc_freeze: bool = Field(
        True,
        description="Once the engines have started, collect garbage and move every object alive then into the "
        "garbage collector's permanent generation (gc.freeze), once per process: later full collections skip the "
        "start-up heap (~20 ms each with it, a pause of every request in flight).",
    )

    # Input limits (422 past them)
    max_rank: int = Field(4, ge=2, le=4, description="Largest tensor rank accepted (2 to 4).")
    max_dim: int = Field(16384, ge=1, description="Largest size of any one tensor dimension.")
    max_tensor_elements: int = Field(1 << 24, ge=1, description="Largest element count of any one input tensor.")
    max_vocab: int = Field(
        1 << 20,
        ge=1,
        description="Largest size of any axis of /v1/sample and /v1/calibrate logits (vocabulary, classes, rows).",
    )

    # Budgets (413 past them, checked before anything large is allocated)
    max_work_flops: float = Field(
        2e11,
        gt=0,
        description="Largest estimated work of one request, in float32 GEMM-equivalent operations: its estimated "
        "single-core time on the reference machine times 50 GFLOP/s (2e11 is about 4 core-seconds; see "
        "service/engines/cost.py), scaled to this machine by ATTN_COST_CALIBRATION.",
    )
    memory_budget_bytes: int = Field(
        1 << 30,
        ge=1 << 20,
        description="Estimated memory of the requests computed at once by one worker process (inputs, engine "
        "intermediates, results and response). A request whose own estimate exceeds it is refused (413); others wait "
        "for room up to ATTN_QUEUE_TIMEOUT_S (then 503). Request bodies count too, from admission "
        "(ATTN_BODY_MEMORY_BYTES).",
    )
    body_memory_bytes: int = Field(
        0,
        ge=0,
        description="How much of ATTN_MEMORY_BUDGET_BYTES request bodies may hold: each admitted request reserves "
        "its declared length (a streamed body, what arrives; a gzip body, what it inflates to; a gRPC message, its "
        "size) until it ends, and is refused 503 with Retry-After (gRPC: UNAVAILABLE) while the budget's "
        "reservations would pass this; the rest of the budget stays for the work in progress. REST bodies and gRPC "
        "messages share it. "
        "0: half the budget, at least ATTN_MAX_BODY_BYTES.",
    )
    cost_calibration: str = Field(
        "auto",
        description="How the cost model fits this machine: 'auto' (serve times the kernels at start, before it "
        "listens, and scales the model where this machine is slower than the reference), 'off' (the reference's "
        "constants), or factors such as 'gemm=1,sparsemax=1.7,entmax15=1.6' (a kernel not named keeps 1).",
    )
    max_response_bytes: int = Field(
        256 << 20, ge=1024, description="Largest estimated size of one response body, in bytes."
    )

    # HTTP response compression (request bodies inflate up to max_body_bytes)
    gzip_min_bytes: int = Field(
        64 << 10, ge=0, description="Responses at least this large are gzip-compressed when the client accepts gzip."
    )
    gzip_level: int = Field(1, ge=0, le=9, description="zlib level of response compression; 0 turns it off.")
    inline_max_body_bytes: int = Field(
        2048,
        ge=0,
        description="Only requests with a body this small may run on the event loop (and then only when their "
        "estimated work is under ATTN_INLINE_MAX_WORK_FLOPS); the others run in the thread pool.",
    )
    inline_max_work_flops: float = Field(
        1e7,
        ge=0,
        description="Largest estimated work (GEMM-equivalent operations, as ATTN_MAX_WORK_FLOPS; 1e7 is about "
        "0.2 ms of one core) computed on the event loop: cheaper than a thread hop. Costlier requests run in the "
        "thread pool.",
    )

    # Engines
    models_dir: Path = Field(
        default_factory=default_models_dir,
        description="The exported ONNX graphs and their manifest; default: the copy shipped in the package.",
    )
    enable_onnx: bool = Field(
        True, description="Load the ONNX Runtime engine at start (false: numpy serves everything)."
    )
    onnx_required: bool = Field(
        False,
        description="Not ready unless the ONNX engine started; by default a broken or missing graph leaves the "
        "service ready in degraded mode, serving every request on numpy.",
    )
    onnx_providers: list[str] | None = Field(
        None, description="Execution providers in order of preference; default: best available."
    )
    onnx_intra_op_threads: int = Field(0, ge=0, description="0 lets ONNX Runtime choose.")
    onnx_graph_optimization_level: Literal["disable", "basic", "extended", "all"] = Field(
        "all", description="ONNX Runtime's graph optimization level for every session."
    )
    onnx_memory_arena: bool = Field(
        False,
        description="Keep ONNX Runtime's CPU memory arena: faster repeated large requests, but the process keeps its "
        "peak memory after each one.",
    )
    auto_numpy_max_scores: int = Field(
        4096,
        ge=0,
        description="Engine 'auto' tries numpy first up to this many scores (B*Hq*L*S): lower per-call overhead.",
    )
    auto_numpy_large_scores: int = Field(
        1 << 22,
        ge=0,
        description="Engine 'auto' also tries numpy first above this many scores when the request returns weights "
        "and ONNX Runtime runs on the CPU without its memory arena (numpy's chunked pass is faster there); "
        "0 turns this off.",
    )
    numpy_threads: int = Field(
        0,
        ge=0,
        le=256,
        description="Worker threads of the numpy engine (BLAS then runs one thread each); 0: one per CPU.",
    )

    # Diagnostics thresholds (docs/concepts/diagnostics.md)
    diag_collapsed_max_weight: float = Field(
        _DIAG.collapsed_max_weight, gt=0, le=1, description="A row collapses when its largest weight is at least this."
    )
    diag_collapsed_row_fraction: float = Field(
        _DIAG.collapsed_row_fraction,
        ge=0,
        le=1,
        description="A head is 'collapsed' when more than this fraction of its informative rows collapse.",
    )
    diag_uniform_normalized_entropy: float = Field(
        _DIAG.uniform_normalized_entropy,
        gt=0,
        le=1,
        description="A head is 'uniform' when its mean normalized entropy is at least this.",
    )
    diag_saturation_margin: float = Field(
        _DIAG.saturation_margin,
        gt=0,
        lt=1,
        description="A row is saturated when its largest weight exceeds 1 - margin (softmax's gradients vanish).",
    )
    diag_vanishing_threshold: float = Field(
        1e-3,
        ge=0,
        description="gradient_health: a row's gradient vanishes when the normalizer's Jacobian norm is below this.",
    )

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
    grpc_port: int = Field(8001, ge=0, le=65535, description="gRPC port, on ATTN_HOST (Triton's default, 8001).")
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
        description="Calls gRPC serves at once, health checks, reflection and Watch streams included; a call past "
        "it is refused RESOURCE_EXHAUSTED by gRPC before its message is read. A message is received in full before "
        "it reaches the memory budget, so this times ATTN_MAX_BODY_BYTES bounds what a flood of large messages can "
        "hold. 0: no limit.",
    )
    api_keys: Annotated[list[SecretStr] | None, NoDecode] = Field(
        None, description="API keys; unset: no authentication. Each >= 16 characters."
    )
    auth_exempt_paths: Annotated[list[str], NoDecode] = Field(
        ["/healthz", "/readyz", "/metrics", "/v2/health/live", "/v2/health/ready"],
        description="Paths served without an API key (probes and scrapes).",
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
        "record).",
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
