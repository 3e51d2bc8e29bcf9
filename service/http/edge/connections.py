"""The cap on open connections and the refusals written straight to a socket: the limits of one worker
process (from the ``ATTN_*`` environment, the cap fitted under ``RLIMIT_NOFILE``) and the problem+json
answers the connection layer (:mod:`service.http.edge.protocol`) sends without reaching the app.
"""

from __future__ import annotations

import functools
import resource
from dataclasses import dataclass

from service.http.error_responses import PROBLEM_MEDIA_TYPE, PROBLEM_TYPE_BASE

FD_RESERVE = 128
"""File descriptors kept for the process itself (listening sockets, metrics files, engines, gRPC, threads)
when the cap on connections is fitted under ``RLIMIT_NOFILE``."""


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """What one worker allows a connection (the ``ATTN_*`` settings of the same names)."""

    max_header_bytes: int
    header_timeout_s: float
    send_timeout_s: float
    max_connections: int = 1 << 30
    linger_time_s: float = 10.0
    linger_timeout_s: float = 2.0
    linger_max_bytes: int = 64 << 20


def descriptor_room(max_connections: int) -> int:
    """``max_connections``, lowered where the soft ``RLIMIT_NOFILE`` cannot hold that many sockets beside
    :data:`FD_RESERVE` descriptors of the process's own.
    """
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return max_connections
    return max(1, min(max_connections, soft - FD_RESERVE))


def raise_descriptor_limit(max_connections: int) -> tuple[int, int]:
    """Raise the soft ``RLIMIT_NOFILE`` towards the hard limit, as far as ``max_connections`` needs; returns
    (the soft limit now, the connections it holds). Called by ``serve`` before the workers start.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = max_connections + FD_RESERVE
    if soft != resource.RLIM_INFINITY and soft < wanted:
        target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        if target > soft:
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
                soft = target
            except (ValueError, OSError):
                pass
    return soft, descriptor_room(max_connections)


@functools.cache
def connection_limits() -> ConnectionLimits:
    """The limits of this process, from the ``ATTN_*`` environment (read once per worker)."""
    from service.settings import Settings

    s = Settings()
    return ConnectionLimits(
        s.max_header_bytes,
        s.header_timeout_s,
        s.send_timeout_s,
        descriptor_room(s.max_connections),
        s.linger_time_s,
        s.linger_timeout_s,
        s.linger_max_bytes,
    )


def problem_response(status: str, slug: str, title: str, detail: str, extra: bytes = b"") -> bytes:
    """A whole HTTP/1.1 problem+json answer (status line, headers, body) that closes the connection."""
    code = status.split()[0]
    body = (
        '{"type":"'
        + PROBLEM_TYPE_BASE
        + slug
        + '","title":"'
        + title
        + '","status":'
        + code
        + ',"detail":"'
        + detail
        + '"}'
    ).encode()
    return (
        b"HTTP/1.1 " + status.encode() + b"\r\ncontent-type: " + PROBLEM_MEDIA_TYPE.encode()
        + b"\r\ncontent-length: " + str(len(body)).encode() + b"\r\n" + extra + b"connection: close\r\n\r\n" + body
    )  # fmt: skip


def response_431(limit: int) -> bytes:
    """The answer to headers over ``limit`` bytes."""
    return problem_response(
        "431 Request Header Fields Too Large",
        "headers-too-large",
        "Request header fields too large",
        f"the request line and headers are larger than the limit of {limit} bytes",
    )


def response_503_connections(limit: int) -> bytes:
    """The answer to a connection past the cap of ``limit`` open connections."""
    return problem_response(
        "503 Service Unavailable",
        "unavailable",
        "Service unavailable",
        f"this server process has {limit} connections open, its limit (ATTN_MAX_CONNECTIONS); retry after 1 s",
        b"retry-after: 1\r\n",
    )
