"""Service settings, read from the environment with the prefix ``ATTN_``.

Every limit the service enforces is here with a safe default. Each field's description is its documentation:
docs/reference/settings.md is generated from :class:`Settings` (docs/hooks/reference.py), which is one class of
every field, composed of a class per concern:

Layout:

- ``server``: where the server listens, its workers, its log level, the start-up heap's freeze; how it stops;
- ``limits``: input limits, the budgets of work, memory and answer size (and the cost model's calibration), which
  requests run on the event loop, admission to the compute slots;
- ``compute``: the engines and the diagnostics' thresholds;
- ``transport``: HTTP response compression, the HTTP connections' limits, the gRPC server's;
- ``security``: API keys, the paths and pages served without one, CORS;
- ``observability``: the metrics' multiprocess directory, the log format, tracing;
- ``sessions``: attention sessions (their switch, cache budget, idle time and caps).

The checks across concerns (a body larger than the memory budget, the gRPC port on the REST port, ...) are
:class:`Settings`' own.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping

from pydantic import model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from service.settings.compute import DiagnosticSettings, EngineSettings
from service.settings.limits import AdmissionSettings, InlineSettings, LimitSettings
from service.settings.observability import ObservabilitySettings
from service.settings.security import AccessSettings
from service.settings.server import LifecycleSettings, ServerSettings
from service.settings.sessions import SessionSettings
from service.settings.transport import CompressionSettings, ConnectionSettings, GrpcSettings

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


class Settings(
    LifecycleSettings,
    SessionSettings,
    ObservabilitySettings,
    AccessSettings,
    GrpcSettings,
    ConnectionSettings,
    AdmissionSettings,
    DiagnosticSettings,
    EngineSettings,
    InlineSettings,
    CompressionSettings,
    LimitSettings,
    ServerSettings,
    BaseSettings,
):
    """All configuration of one service process (env prefix ``ATTN_``), and the checks across its parts.

    pydantic lists the fields of the last base first: the bases are named in the reverse of the order in which
    docs/reference/settings.md lists the settings (the server's first, the lifecycle's last).
    """

    # hide_input_in_errors: a refused setting must not echo API keys into logs.
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, env_file=None, extra="ignore", hide_input_in_errors=True)

    @model_validator(mode="after")
    def _refuse_unsafe(self) -> Settings:
        """Refuse to start on a setting that would silently weaken the service, or an unknown ATTN_* name."""
        problems = unknown_env_names(os.environ, set(type(self).model_fields))
        problems += self.access_problems()
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
        if self.sessions and self.workers > 1:
            problems.append(
                "ATTN_SESSIONS=true needs ATTN_WORKERS=1: a session's key/value cache lives in one worker process and "
                "uvicorn hands each request to any worker (run one worker per replica and route a sequence to its "
                "replica: docs/guides/sessions.md)"
            )
        if self.session_cache_bytes > self.memory_budget_bytes:
            problems.append("ATTN_SESSION_CACHE_BYTES must not exceed ATTN_MEMORY_BUDGET_BYTES")
        if problems:
            raise ValueError("unsafe settings: " + "; ".join(problems))
        return self

    def sessions_served(self) -> bool:
        """Whether this process serves ``attention_session``: ``sessions``, or by default one worker."""
        return self.sessions if self.sessions is not None else self.workers == 1

    def session_cache_limit(self) -> int:
        """``session_cache_bytes``, or its default: a quarter of the memory budget."""
        return self.session_cache_bytes or self.memory_budget_bytes // 4

    def body_memory_limit(self) -> int:
        """``body_memory_bytes``, or its default: half the memory budget, at least the largest body."""
        return self.body_memory_bytes or max(self.max_body_bytes, self.memory_budget_bytes // 2)
