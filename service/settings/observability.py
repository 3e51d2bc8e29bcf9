"""What the service reports and how: the metrics' multiprocess directory, the log lines' format, tracing (the log
level is the server's, :class:`~service.settings.server.ServerSettings`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field


class ObservabilitySettings(BaseModel):
    """Metrics with several workers, the log format, OpenTelemetry tracing."""

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
