"""What computes: the engines (the ONNX graphs and their sessions, the numpy engine's threads, which engine 'auto'
tries first) and the diagnostics' thresholds (docs/concepts/diagnostics.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from service.core.diagnostics import DiagnosticThresholds
from service.models_location import default_models_dir

_DIAG = DiagnosticThresholds()


class EngineSettings(BaseModel):
    """The engines: ONNX Runtime's (on at start unless turned off) and numpy's."""

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
        "and ONNX Runtime runs on the CPU without its memory arena or huge pages (numpy's chunked pass is faster "
        "there); 0 turns this off.",
    )
    malloc_huge_pages: bool = Field(
        True,
        description="`serve` starts itself with glibc malloc asking for transparent huge pages "
        "(GLIBC_TUNABLES=glibc.malloc.hugetlb=1; glibc 2.35+, a kernel whose THP mode is not 'never'): ONNX "
        "Runtime's fresh large buffers then fault in 2 MiB at a time, and freed memory still goes back to the OS. "
        "A GLIBC_TUNABLES that names the tunable already is kept as it is.",
    )
    numpy_threads: int = Field(
        0,
        ge=0,
        le=256,
        description="Worker threads of the numpy engine (BLAS then runs one thread each); 0: one per CPU.",
    )


class DiagnosticSettings(BaseModel):
    """The diagnostics' thresholds."""

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

    def diagnostic_thresholds(self) -> DiagnosticThresholds:
        """The diagnostics thresholds as the core expects them."""
        return DiagnosticThresholds(
            collapsed_max_weight=self.diag_collapsed_max_weight,
            collapsed_row_fraction=self.diag_collapsed_row_fraction,
            uniform_normalized_entropy=self.diag_uniform_normalized_entropy,
            saturation_margin=self.diag_saturation_margin,
        )
