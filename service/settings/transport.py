"""What the front ends' connections may do: HTTP response compression, the HTTP connections' timeouts and limits
(``service/http/edge``), and the gRPC server's (``service/grpc``); docs/operations/production.md.
"""

from __future__ import annotations

from pydantic import BaseModel, Field


class CompressionSettings(BaseModel):
    """HTTP response compression (request bodies inflate up to ATTN_MAX_BODY_BYTES)."""

    gzip_min_bytes: int = Field(
        64 << 10, ge=0, description="Responses at least this large are gzip-compressed when the client accepts gzip."
    )
    gzip_level: int = Field(1, ge=0, le=9, description="zlib level of response compression; 0 turns it off.")


class ConnectionSettings(BaseModel):
    """HTTP connections: how long a body, the headers or a client may take, how many connections, the lingering
    close.
    """

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


class GrpcSettings(BaseModel):
    """gRPC (the Open Inference Protocol's gRPC form, beside REST in the same process; service/grpc)."""

    grpc_enabled: bool = Field(True, description="Serve gRPC (inference.GRPCInferenceService) beside REST.")
    grpc_port: int = Field(
        8001, ge=0, le=65535, description="gRPC port, on ATTN_HOST (Triton's default, 8001; serve's --grpc-port)."
    )
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
        le=65536,
        description="Inference calls (ModelInfer, ModelMetadata, ModelReady, ServerMetadata) served at once per worker "
        "process; past it a call is refused RESOURCE_EXHAUSTED with retry-after before its message is read (0: no "
        "limit). Probes and long-lived streams have caps of their own, so neither class can shut the other out.",
    )
    grpc_max_concurrent_probes: int = Field(
        64,
        ge=1,
        le=65536,
        description="Probe calls (grpc.health.v1.Health/Check, ServerLive, ServerReady) served at once per worker "
        "process; past it RESOURCE_EXHAUSTED with retry-after. A probe answers in well under a millisecond once "
        "its message is in, and its message must arrive within one second.",
    )
    grpc_max_concurrent_streams: int = Field(
        32,
        ge=1,
        le=65536,
        description="Long-lived streams (health Watch, server reflection) open at once per worker process; past it "
        "RESOURCE_EXHAUSTED with retry-after.",
    )
    grpc_max_streams_per_connection: int = Field(
        100,
        ge=1,
        le=65536,
        description="Calls of one connection served at once per worker process (100: the most concurrent streams "
        "HTTP/2 asks a peer to allow at least); past it RESOURCE_EXHAUSTED with retry-after, before the message is "
        "read.",
    )
