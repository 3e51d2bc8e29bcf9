"""Attention sessions (the model ``attention_session``): whether they are served, the memory their key/value
caches may hold, how long an idle one lives, and how many positions and sessions one caller may keep.
"""

from __future__ import annotations

from pydantic import BaseModel, Field


class SessionSettings(BaseModel):
    """The sessions' switch, cache budget, idle time and caps (docs/guides/sessions.md)."""

    sessions: bool | None = Field(
        None,
        description="Serve the model attention_session (a server-side key/value cache per sequence). Unset: on "
        "with one worker, off with several (a session's cache lives in one worker process, and uvicorn hands a "
        "request to any worker); true with ATTN_WORKERS > 1 is refused at start. Scale sessions out with replicas "
        "(docs/guides/sessions.md).",
    )
    session_cache_bytes: int = Field(
        0,
        ge=0,
        description="Memory the sessions' key/value caches may hold together, inside ATTN_MEMORY_BUDGET_BYTES (0: a "
        "quarter of it, 256 MiB by default). A "
        "cache that needs more first evicts the least recently used idle sessions; with none to evict the step is "
        "refused 503 (gRPC UNAVAILABLE) with Retry-After.",
    )
    session_idle_s: float = Field(
        60.0,
        gt=0,
        le=86400,
        description="A session with no step for this long is evicted (its next step is refused, naming the "
        "eviction). Triton's default (1 s) suits machine clients; a minute lets a person step through a sequence, "
        "and idle sessions are evicted sooner, least recently used first, when the cache budget is full.",
    )
    session_max_positions: int = Field(
        32768,
        ge=1,
        description="Most key positions one session's cache keeps; a step past it is refused 413 (gRPC "
        "RESOURCE_EXHAUSTED). A session started with a window (StreamingLLM's sinks plus window) never grows past "
        "sinks + window.",
    )
    session_end_with_stream: bool = Field(
        False,
        description="End a sequence when a gRPC ModelStreamInfer stream that carried its steps closes, however it "
        "closes (the client's end, a cancel, a lost connection). Off: a sequence outlives its stream, as in Triton, "
        "until its end, its idle time or its eviction.",
    )
    session_max_per_key: int = Field(
        1024,
        ge=1,
        description="Most live sessions one API key (or, without keys, all callers together) may hold; a start past "
        "it is refused 503 (gRPC UNAVAILABLE) until one ends or idles out.",
    )
