"""Command line: ``python -m service serve`` starts the server; ``export-models`` writes models/."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m service", description="Attention inference service.")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="start the HTTP server (defaults from ATTN_* settings)")
    serve.add_argument("--host", help="bind address (ATTN_HOST, default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port (ATTN_PORT, default 8000)")
    serve.add_argument("--workers", type=int, help="worker processes (ATTN_WORKERS, default 1)")
    export = sub.add_parser("export-models", help="build the ONNX graphs into models/ (deterministic)")
    export.add_argument("--out", help="directory (default: the repository's models/)")
    openapi = sub.add_parser("openapi", help="print the OpenAPI schema the app serves, as YAML (needs PyYAML)")
    openapi.add_argument("--out", help="write to this file instead of stdout")
    args = parser.parse_args(argv)

    if args.command == "serve":
        import uvicorn

        from service.settings import Settings

        overrides = {k: v for k, v in (("host", args.host), ("port", args.port), ("workers", args.workers)) if v is not None}
        settings = Settings(**overrides)
        uvicorn.run(
            "service.asgi:create_app_from_env",
            factory=True,
            host=settings.host,
            port=settings.port,
            workers=settings.workers,
            log_level=settings.log_level,
            server_header=False,
        )
        return 0
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
