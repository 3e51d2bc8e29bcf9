"""The server process: where it listens, its worker processes, what it logs, the start-up heap's freeze, and how it
stops.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class ServerSettings(BaseModel):
    """Where the server listens, its worker processes, its log level and the start-up heap's freeze."""

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


class LifecycleSettings(BaseModel):
    """How the server stops, and the test-only delay of every admitted request."""

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
