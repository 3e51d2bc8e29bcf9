"""The first part of the service's settings (:class:`service.settings.Settings` adds the rest): the server, the
input limits, the budgets, response compression, the engines and the diagnostics thresholds. One class with
every field is what users see (docs/reference/settings.md lists the fields in this order, then the rest).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from service.core.diagnostics import DiagnosticThresholds
from service.models_location import default_models_dir

_DIAG = DiagnosticThresholds()


class ComputeSettings(BaseSettings):
    """The server, input limits, budgets, compression, engines and diagnostics (env prefix ``ATTN_``)."""

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
