"""Command line: ``python -m service serve`` starts the server; ``export-models`` writes models/;
``attention``, ``softmax`` and ``sample`` compute one answer (:mod:`service.cli`).
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from service.settings import Settings


def _exit_zero(signum: int, frame: object) -> None:
    raise SystemExit(0)


def _serve(settings: Settings) -> int:
    """Run uvicorn until SIGTERM or SIGINT, then let requests in flight finish (up to
    ``shutdown_grace_s``) and exit 0.
    """
    import uvicorn

    from service.observability.logs import log_config
    from service.observability.multiproc import prepare_metrics_dir

    prepare_metrics_dir(settings.metrics_dir)  # before anything imports prometheus-client
    # After a graceful shutdown uvicorn re-raises the signal it caught, which would end the process
    # as "killed by SIGTERM"; this handler (also live before uvicorn starts) makes that exit 0.
    signal.signal(signal.SIGTERM, _exit_zero)
    uvicorn.run(
        "service.asgi:create_app_from_env",
        factory=True,
        host=settings.host,
        port=settings.port,
        workers=settings.workers,
        log_level=settings.log_level,
        log_config=log_config(settings.log_level, settings.log_format),
        access_log=False,  # the service writes its own access line per request (service.access)
        server_header=False,
        # uvicorn annotates this int but hands it to asyncio.wait_for, which takes a float.
        timeout_graceful_shutdown=settings.shutdown_grace_s,  # type: ignore[arg-type]
        # uvicorn's own limit: idle time of a kept-alive connection. Header size and time and the send
        # timeout come from this protocol (uvicorn's httptools protocol has none; see its docstring).
        # uvicorn annotates this int but hands it to loop.call_later, which takes a float.
        timeout_keep_alive=settings.keep_alive_timeout_s,  # type: ignore[arg-type]
        http="service.http.edge.protocol:BoundedHttpToolsProtocol",
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m service", description="Attention inference service.")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="start the HTTP server (defaults from ATTN_* settings)")
    serve.add_argument("--host", help="bind address (ATTN_HOST, default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port (ATTN_PORT, default 8000)")
    serve.add_argument("--workers", type=int, help="worker processes (ATTN_WORKERS, default 1)")
    export = sub.add_parser("export-models", help="build the ONNX graphs into models/ (deterministic)")
    export.add_argument("--out", help="directory (default: a checkout's models/, else ./models)")
    openapi = sub.add_parser("openapi", help="print the OpenAPI schema the app serves, as YAML (needs PyYAML)")
    openapi.add_argument("--out", help="write to this file instead of stdout")
    from service.cli.args import COMMANDS, add_subcommands

    add_subcommands(sub)
    args = parser.parse_args(argv)

    if args.command in COMMANDS:
        try:
            from service.cli.commands import run
        except ImportError as exc:  # the client's httpx is the `client` extra
            print(
                f"python -m service {args.command} needs {exc.name}: pip install 'attention-service[client]'",
                file=sys.stderr,
            )
            return 2
        return run(args)

    if args.command == "serve":
        from pydantic import ValidationError

        from service.settings import Settings

        overrides = {
            k: v for k, v in (("host", args.host), ("port", args.port), ("workers", args.workers)) if v is not None
        }
        try:
            settings = Settings(**overrides)
        except ValidationError as exc:
            print(f"refusing to start: {exc}", file=sys.stderr)
            return 2
        return _serve(settings)
    if args.command == "export-models":
        from service.export import main as export_main

        return export_main(["--out", args.out] if args.out else [])
    if args.command == "openapi":
        from service.openapi import render_openapi_yaml

        text = render_openapi_yaml()
        if args.out:
            with open(args.out, "w") as f:
                f.write(text)
        else:
            sys.stdout.write(text)
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
