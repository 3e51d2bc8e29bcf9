"""Who may call: API keys, the paths and pages served without one, and CORS (docs/operations/production.md)."""

from __future__ import annotations

import json
import re
from typing import Annotated, Any

from pydantic import BaseModel, Field, SecretStr, field_validator
from pydantic_settings import NoDecode

MIN_API_KEY_LENGTH = 16
_ORIGIN = re.compile(r"https?://[A-Za-z0-9.\-\[\]:]+")


class AccessSettings(BaseModel):
    """API keys, the paths and pages served without one, and CORS."""

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

    def access_problems(self) -> list[str]:
        """Why these settings would let callers in unsafely: a key too short or an empty list of keys, an exempt
        path that is not one, an origin that is not one, or any origin with credentials.
        """
        problems = []
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
        return problems
