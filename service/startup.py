"""A start that cannot succeed ends with one line that says why, never a traceback.

- :func:`check_ports`: ``serve`` tries the REST and gRPC ports before anything starts (before the workers, the
  engines and gRPC); a port another process holds ends the start with exit 3, uvicorn's code for a failed start.
  The check binds without ``SO_REUSEPORT``, so it also refuses a port that another server shares among its
  own workers with ``SO_REUSEPORT`` (gRPC would otherwise join that server's group and take half its calls).
- :class:`StartupError` and :func:`report_startup_errors`: a failure the operator can fix that shows only once
  the app starts (another process took the gRPC port after the check) is logged as its message alone, where
  uvicorn would log the traceback Starlette hands it.
"""

from __future__ import annotations

import errno
import socket
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

    from service.settings import Settings


class StartupError(RuntimeError):
    """A start-up failure an operator can fix (a port in use): its message is the whole report."""


def port_problem(host: str, port: int) -> str | None:
    """Why ``host:port`` cannot be bound for listening: held by another process, or privileged (None otherwise).
    Port 0 (any free port) always can.
    """
    if port == 0:
        return None
    try:
        addresses = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        return f"its address {host!r} does not resolve ({exc.strerror})"
    for family, kind, proto, _, address in addresses:
        with socket.socket(family, kind, proto) as sock:
            # SO_REUSEADDR as uvicorn and gRPC set it (a port left in TIME_WAIT is free); no SO_REUSEPORT.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(address)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    return "another process holds it (another server, another instance of this one)"
                if exc.errno == errno.EACCES:
                    return "permission denied (a port below 1024 needs privileges)"
                # Anything else (an address this machine lacks, as ::1 without IPv6) is left to the server's
                # own bind, which may still listen on the host's other addresses.
    return None


def check_ports(settings: Settings) -> str | None:
    """One line that says which port ``serve`` cannot listen on and how to choose another; None when both are free."""
    ports = [("REST", settings.port, "--port / ATTN_PORT")]
    if settings.grpc_enabled:
        ports.append(("gRPC", settings.grpc_port, "--grpc-port / ATTN_GRPC_PORT, or ATTN_GRPC_ENABLED=false"))
    for name, port, setting in ports:
        problem = port_problem(settings.host, port)
        if problem is not None:
            where = f"{settings.host}:{port}"
            return f"cannot start: the {name} port {where} cannot be bound: {problem}; choose another ({setting})"
    return None


def report_startup_errors(app: ASGIApp) -> ASGIApp:
    """``app``, whose failed start-up on a :class:`StartupError` is reported as its message, not a traceback.

    Starlette sends ``lifespan.startup.failed`` with the traceback as its message while the exception is being
    handled; uvicorn logs that message, then "Application startup failed" and exits 3 (and logs nothing more).
    """

    async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await app(scope, receive, send)
            return

        async def send_plainly(message: Message) -> None:
            failure = sys.exc_info()[1]
            if message["type"] == "lifespan.startup.failed" and isinstance(failure, StartupError):
                message = {**message, "message": str(failure)}
            await send(message)

        await app(scope, receive, send_plainly)

    return wrapped
