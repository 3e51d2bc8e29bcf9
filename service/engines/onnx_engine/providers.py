"""Execution providers: which to request, by preference or configuration, and what this onnxruntime offers."""

from __future__ import annotations

# Execution providers in order of preference when none are configured.
PREFERRED_PROVIDERS: tuple[str, ...] = (
    "TensorrtExecutionProvider",
    "CUDAExecutionProvider",
    "ROCMExecutionProvider",
    "DmlExecutionProvider",
    "CoreMLExecutionProvider",
    "OpenVINOExecutionProvider",
    "CPUExecutionProvider",
)
# Short names accepted in configuration (case-insensitive), e.g. ATTN_ONNX_PROVIDERS='["cuda","cpu"]'.
PROVIDER_ALIASES: dict[str, str] = {
    "tensorrt": "TensorrtExecutionProvider",
    "trt": "TensorrtExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "rocm": "ROCMExecutionProvider",
    "dml": "DmlExecutionProvider",
    "directml": "DmlExecutionProvider",
    "coreml": "CoreMLExecutionProvider",
    "openvino": "OpenVINOExecutionProvider",
    "cpu": "CPUExecutionProvider",
}


def choose_providers(available: list[str], configured: list[str] | None) -> tuple[list[str], list[str]]:
    """(providers to request, warnings).

    Without a configuration: the available providers in :data:`PREFERRED_PROVIDERS`
    order. With one: the configured providers (full names or short aliases) in the
    given order, dropping those this onnxruntime build lacks (with a warning). The
    CPU provider always closes the list, so nodes other providers lack still run.
    """
    warnings: list[str] = []
    if not configured:
        chosen = [p for p in PREFERRED_PROVIDERS if p in available]
    else:
        chosen = []
        for name in configured:
            full = PROVIDER_ALIASES.get(name.strip().lower(), name.strip())
            if full not in available:
                warnings.append(
                    f"configured execution provider {name!r} is not available in this onnxruntime "
                    f"build (available: {', '.join(available)}); skipped"
                )
            elif full not in chosen:
                chosen.append(full)
    if "CPUExecutionProvider" not in chosen:
        chosen.append("CPUExecutionProvider")
    return chosen, warnings


def ort_version() -> str | None:
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    version: str = ort.__version__
    return version


def available_providers() -> list[str]:
    try:
        import onnxruntime as ort
    except ImportError:
        return []
    return list(ort.get_available_providers())
