"""Service settings, read from the environment with the prefix ``ATTN_``.

Every limit the service enforces is here with a safe default; see the README
table for what each one means.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from service.core.diagnostics import DiagnosticThresholds

_DIAG = DiagnosticThresholds()

DEFAULT_MODELS_DIR = Path(__file__).resolve().parent.parent / "models"


class Settings(BaseSettings):
    """All configuration of one service process (env prefix ``ATTN_``)."""

    model_config = SettingsConfigDict(env_prefix="ATTN_", env_file=None, extra="ignore")

    # Server
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    workers: int = Field(1, ge=1, le=64)
    log_level: Literal["critical", "error", "warning", "info", "debug"] = "info"

    # Input limits (422 past them)
    max_rank: int = Field(4, ge=2, le=4, description="Largest tensor rank accepted (2 to 4).")
    max_dim: int = Field(16384, ge=1, description="Largest size of any one tensor dimension.")
    max_tensor_elements: int = Field(1 << 24, ge=1, description="Largest element count of any one input tensor.")

    # Budgets (413 past them, checked before anything large is allocated)
    max_work_flops: float = Field(
        2e10, gt=0, description="Largest estimated work of one request, in floating-point operations."
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
        2048, ge=0,
        description="Requests with a body this small run on the event loop (their work costs less than a thread hop); "
        "larger ones in the thread pool.",
    )

    # Engines
    models_dir: Path = DEFAULT_MODELS_DIR
    enable_onnx: bool = True
    onnx_providers: list[str] | None = Field(
        None, description="Execution providers in order of preference; default: best available."
    )
    onnx_intra_op_threads: int = Field(0, ge=0, description="0 lets ONNX Runtime choose.")
    onnx_graph_optimization_level: Literal["disable", "basic", "extended", "all"] = "all"

    # Diagnostics thresholds (semantics.md, "Diagnostics")
    diag_collapsed_max_weight: float = Field(_DIAG.collapsed_max_weight, gt=0, le=1)
    diag_collapsed_row_fraction: float = Field(_DIAG.collapsed_row_fraction, ge=0, le=1)
    diag_uniform_normalized_entropy: float = Field(_DIAG.uniform_normalized_entropy, gt=0, le=1)
    diag_saturation_margin: float = Field(_DIAG.saturation_margin, gt=0, lt=1)

    def diagnostic_thresholds(self) -> DiagnosticThresholds:
        """The diagnostics thresholds as the core expects them."""
        return DiagnosticThresholds(
            collapsed_max_weight=self.diag_collapsed_max_weight,
            collapsed_row_fraction=self.diag_collapsed_row_fraction,
            uniform_normalized_entropy=self.diag_uniform_normalized_entropy,
            saturation_margin=self.diag_saturation_margin,
        )
