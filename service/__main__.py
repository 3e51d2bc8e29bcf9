"""Command line (``attention-service``, or ``python -m service``): ``serve`` starts the server;
``export-models`` writes models/ (the ``export`` extra); ``openapi`` prints the schema; ``attention``,
``softmax``, ``backward``, ``analyze``, ``sample`` and ``calibrate`` compute one answer, against a service
through the client (the ``client`` extra) or in this process with ``--local`` (:mod:`service.cli`).

Every command works in a plain install or exits 2 with one line that says what to install.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import re
import signal
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from service.cli.args import COMMANDS, SERVE_FLAGS, build_parser, program_name

STARTUP_FAILURE = 3
"""uvicorn's exit status for a server that failed to start (its ``uvicorn.config.STARTUP_FAILURE``)."""

if TYPE_CHECKING:
    from service.settings import Settings


def _exit_zero(signum: int, frame: object) -> None:
    raise SystemExit(0)


def export_serve_flags(args: argparse.Namespace) -> None:
    """Put each ``serve`` flag given into the environment as its ``ATTN_*`` variable (``--grpc-port 9001``:
    ``ATTN_GRPC_PORT=9001``), replacing the variable however it is spelled: the worker processes build their
    settings from the environment, so a flag and its variable are one thing to the server and every worker.
    """
    for name in SERVE_FLAGS:
        value = getattr(args, name)
        if value is None:
            continue
        variable = "ATTN_" + name.upper()
        for spelled in [key for key in os.environ if key.upper() == variable]:
            del os.environ[spelled]
        os.environ[variable] = str(value)


def _serve(settings: Settings) -> int:
    """Run uvicorn until SIGTERM or SIGINT, then let requests in flight finish (up to
    ``shutdown_grace_s``) and exit 0. Exit 2 when the metrics directory cannot hold the workers' files,
    3 when a port is taken (one line that names it and its setting).
    """
    import logging
    import logging.config

    import uvicorn

    from service.http.edge.connections import raise_descriptor_limit
    from service.observability.logs import log_config
    from service.observability.multiproc import MetricsDirError, check_metrics_room, prepare_metrics_dir
    from service.startup import check_ports

    taken = check_ports(settings)
    if taken is not None:
        print(taken, file=sys.stderr)
        return STARTUP_FAILURE
    metrics_dir = prepare_metrics_dir(settings.metrics_dir)  # before anything imports prometheus-client
    if metrics_dir is not None:
        try:
            check_metrics_room(metrics_dir, settings.workers)
        except MetricsDirError as exc:
            print(f"refusing to start: {exc}", file=sys.stderr)
            return 2
    logging_config = log_config(settings.log_level, settings.log_format)
    logging.config.dictConfig(logging_config)
    soft, connections = raise_descriptor_limit(settings.max_connections)
    if connections < settings.max_connections:
        logging.getLogger("service").warning(
            "RLIMIT_NOFILE is %d: each worker takes at most %d connections (ATTN_MAX_CONNECTIONS is %d); raise the "
            "limit (ulimit -n) to take more",
            soft,
            connections,
            settings.max_connections,
        )
    if settings.cost_calibration == "auto":
        # Once, before the server listens (no request meets the reference's estimates on a slower machine); the
        # workers take the factors from the environment, as an explicit ATTN_COST_CALIBRATION.
        from service.engines.cost_calibration import calibrate, format_factors

        os.environ["ATTN_COST_CALIBRATION"] = format_factors(calibrate())
    # After a graceful shutdown uvicorn re-raises the signal it caught, which would end the process
    # as "killed by SIGTERM"; this handler (also live before uvicorn starts) makes that exit 0.
    signal.signal(signal.SIGTERM, _exit_zero)
    config = uvicorn.Config(
        "service.asgi:create_app_from_env",
        factory=True,
        host=settings.host,
        port=settings.port,
        workers=settings.workers,
        log_level=settings.log_level,
        log_config=logging_config,
        access_log=False,  # the service writes its own access line per request (service.access)
        server_header=False,
        # uvicorn annotates this int but hands it to asyncio.wait_for, which takes a float.
        timeout_graceful_shutdown=settings.shutdown_grace_s,  # type: ignore[arg-type]
        # uvicorn's own limit: idle time of a kept-alive connection. Header size and time, the send timeout, the
        # lingering close and the cap on connections come from this protocol (uvicorn's httptools protocol has
        # none of them; see its docstring).
        # uvicorn annotates this int but hands it to loop.call_later, which takes a float.
        timeout_keep_alive=settings.keep_alive_timeout_s,  # type: ignore[arg-type]
        http="service.http.edge.protocol:BoundedHttpToolsProtocol",
    )
    if settings.workers > 1:
        # uvicorn.run's multiprocess branch, with a supervisor that logs every worker's exit and its cause.
        from service.observability.workers import LoggedMultiprocess

        supervisor = LoggedMultiprocess(config, sockets=[config.bind_socket()])
        supervisor.run()
        return STARTUP_FAILURE if supervisor.startup_failed else 0
    server = uvicorn.Server(config)
    with contextlib.suppress(KeyboardInterrupt):
        server.run()
    return 0 if server.started else STARTUP_FAILURE


def _openapi(args: argparse.Namespace, prog: str) -> int:
    """The schema as YAML (with PyYAML) or JSON: by ``--format``, else ``--out``'s suffix, else what is installed."""
    import json

    from service.openapi import openapi_schema, render_openapi_yaml

    fmt = args.format
    if fmt == "auto" and args.out:
        fmt = {".json": "json", ".yaml": "yaml", ".yml": "yaml"}.get(os.path.splitext(args.out)[1].lower(), "auto")
    if fmt in ("auto", "yaml"):
        try:
            importlib.import_module("yaml")  # PyYAML: the `test` extra, or installed by hand
            has_yaml = True
        except ImportError:
            has_yaml = False
        if fmt == "yaml" and not has_yaml:
            print(f"{prog} openapi: YAML needs PyYAML: pip install pyyaml (or --format json)", file=sys.stderr)
            return 2
        fmt = "yaml" if has_yaml else "json"
    text = render_openapi_yaml() if fmt == "yaml" else json.dumps(openapi_schema(), indent=2) + "\n"
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


def _export(args: argparse.Namespace, prog: str) -> int:
    try:
        from service.export import main as export_main
    except ImportError as exc:
        if exc.name is None or exc.name.split(".")[0] == "service":
            raise
        print(
            f"{prog} export-models needs {exc.name}: pip install 'attention-service[export]'",
            file=sys.stderr,
        )
        return 2
    return export_main(["--out", args.out] if args.out else [])


def _dispatch(args: argparse.Namespace, prog: str) -> int:
    if args.command in COMMANDS:
        from service.cli.commands import run

        return run(args, prog)
    if args.command == "serve":
        from pydantic import ValidationError

        from service.settings import Settings

        export_serve_flags(args)
        try:
            settings = Settings()
        except ValidationError as exc:
            print(f"refusing to start: {exc}", file=sys.stderr)
            return 2
        if settings.malloc_huge_pages:
            _restart_with_huge_pages()
        return _serve(settings)
    if args.command == "export-models":
        return _export(args, prog)
    if args.command == "openapi":
        return _openapi(args, prog)
    return 2


def _restart_with_huge_pages() -> None:
    """Start this command again, in this process (``exec``), with glibc malloc asking for transparent huge pages,
    where it does not yet and can (:func:`service.engines.onnx_engine.heap.huge_pages_environment`): glibc reads
    ``GLIBC_TUNABLES`` only at a process's start. The same command line, the same PID; the workers inherit it.
    """
    from service.engines.onnx_engine.heap import huge_pages_environment

    environment = huge_pages_environment(os.environ)
    if environment is None or not sys.orig_argv:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, sys.orig_argv, environment)


def _quiet_on_closed_pipe() -> int:
    """Standard output was closed by its reader (``... | head``): end without a traceback, as ``yes`` does
    (128 + SIGPIPE). Python would otherwise complain again when it flushes stdout at exit.
    """
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 128 + signal.SIGPIPE


NEGATIVE_VALUE = re.compile(r"-(?:\d|\.\d|inf\b|nan\b)", re.IGNORECASE)
"""The start of a value that is a negative number, or a list that starts with one (``-5,2,1``, ``-.5;1``)."""


def attach_negative_values(argv: Sequence[str]) -> list[str]:
    """``--scores -5,2,1`` as ``--scores=-5,2,1``: argparse takes an argument that starts with ``-`` for an option
    unless it is a single negative number, so a list that starts with one ("expected one argument") needs the
    ``=`` form; a user types the first.
    """
    out: list[str] = []
    for arg in argv:
        previous = out[-1] if out else ""
        if previous.startswith("--") and "=" not in previous and NEGATIVE_VALUE.match(arg):
            out[-1] = f"{previous}={arg}"
        else:
            out.append(arg)
    return out


def main(argv: Sequence[str] | None = None, *, prog: str | None = None) -> int:
    """The command line; the exit status. ``prog`` names the program in messages (default: as invoked)."""
    prog = prog or program_name()
    parser = build_parser(prog)
    args = parser.parse_args(attach_negative_values(sys.argv[1:] if argv is None else argv))
    try:
        status = _dispatch(args, prog)
        sys.stdout.flush()  # a closed pipe shows here, not at exit
    except BrokenPipeError:
        return _quiet_on_closed_pipe()
    return status


if __name__ == "__main__":
    sys.exit(main())
