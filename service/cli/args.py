"""The command line's arguments (imports nothing beyond the standard library, so that every command can
at least parse its arguments, and say what to install, in a plain install).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

URL_ENV = "ATTENTION_URL"
NORMALIZERS = ["softmax", "sparsemax", "entmax15", "entmax", "relu"]
CAUSAL = ["false", "true", "top_left", "bottom_right"]
PRECISIONS = ["float32", "float64"]
SERVE_FLAGS = ("host", "port", "grpc_port", "workers")
"""``serve``'s flags, by setting name: each one given is put in the environment as its ``ATTN_*`` variable, where
the server and every worker process read their settings."""
COMMANDS = ("attention", "softmax", "backward", "analyze", "sample", "calibrate")
"""The computing commands: against a service (``--url``, through the client) or in this process (``--local``)."""

TENSOR_HELP = "a .npy file, FILE.npz[:NAME], a .json file, inline numbers (1,0.5;2,3), or - for stdin"
ATTENTION_RETURNS = ["output", "weights", "scores", "diagnostics", "gradient_health"]
BACKWARD_RETURNS = [
    "grad_query",
    "grad_key",
    "grad_value",
    "grad_mask",
    "grad_scale",
    "grad_temperature",
    "output",
    "weights",
    "gradient_health",
]
SAMPLE_RETURNS = ["tokens", "logprobs", "raw_logprobs", "top_logprobs", "probabilities", "diagnostics"]


def program_name(argv0: str | None = None) -> str:
    """How the program was invoked: ``python -m service`` or the console script's name (``attention-service``)."""
    path = Path(sys.argv[0] if argv0 is None else argv0)
    if path.name in ("__main__.py", "-m", "-c", ""):
        return "python -m service"
    return path.name


def version_line() -> str:
    """``attention-service X`` and the client distribution's version, or that it is not installed."""
    from importlib.metadata import PackageNotFoundError, version

    from service import __version__

    try:
        client = f"attention-client {version('attention-client')}"
    except PackageNotFoundError:
        client = "attention-client not installed"
    return f"attention-service {__version__} ({client})"


def _choices(allowed: list[str]) -> Any:
    """An argparse type for a comma-separated list of names from ``allowed``."""

    def parse(text: str) -> list[str]:
        names = [n.strip() for n in text.split(",") if n.strip()]
        unknown = [n for n in names if n not in allowed]
        if unknown or not names:
            raise argparse.ArgumentTypeError(f"choose from {', '.join(allowed)} (comma-separated), got {text!r}")
        return names

    return parse


def build_parser(prog: str) -> argparse.ArgumentParser:
    """The whole command line: ``serve``, ``export-models``, ``openapi`` and the computing commands."""
    parser = argparse.ArgumentParser(prog=prog, description="Attention inference service.")
    parser.add_argument("--version", action="version", version=version_line())
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve = sub.add_parser(
        "serve",
        help="start the server, REST and gRPC (defaults from ATTN_* settings)",
        description="Start the server. Each flag sets its ATTN_* setting, for every worker process alike.",
    )
    serve.add_argument("--host", help="bind address of REST and gRPC (ATTN_HOST, default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="REST port (ATTN_PORT, default 8000; 0: any free port)")
    serve.add_argument("--grpc-port", type=int, help="gRPC port (ATTN_GRPC_PORT, default 8001; 0: any free port)")
    serve.add_argument("--workers", type=int, help="worker processes (ATTN_WORKERS, default 1)")
    export = sub.add_parser(
        "export-models", help="build the ONNX graphs into models/ (deterministic; needs the export extra)"
    )
    export.add_argument("--out", help="directory (default: a checkout's models/, else ./models)")
    openapi = sub.add_parser(
        "openapi", help="print the OpenAPI schema the app serves (YAML with PyYAML installed, else JSON)"
    )
    openapi.add_argument("--out", help="write to this file instead of stdout (.json: JSON, .yaml/.yml: YAML)")
    openapi.add_argument(
        "--format",
        choices=["auto", "json", "yaml"],
        default="auto",
        help="default: by --out's suffix, else YAML when PyYAML is installed, else JSON",
    )
    add_subcommands(sub)
    return parser


def add_subcommands(sub: Any) -> None:
    """Add the computing commands to the subparsers (the same options as the HTTP API's fields)."""
    common = argparse.ArgumentParser(add_help=False)
    where = common.add_mutually_exclusive_group()
    where.add_argument("--url", help=f"the service (default ${URL_ENV} or http://127.0.0.1:8000; needs the client)")
    where.add_argument("--local", action="store_true", help="compute in this process (no server, no client needed)")
    common.add_argument("--json", action="store_true", help="print the answer as JSON (arrays as nested lists)")
    common.add_argument("--timeout", type=float, default=60.0, help="seconds per attempt (default 60)")

    norm = argparse.ArgumentParser(add_help=False)
    norm.add_argument("--temperature", type=float, help="divides the scores (default 1)")
    norm.add_argument("--normalizer", choices=NORMALIZERS, help="default softmax")
    norm.add_argument("--alpha", type=float, help="for --normalizer entmax (alpha > 1)")

    precision = argparse.ArgumentParser(add_help=False)
    precision.add_argument("--precision", choices=PRECISIONS, default="float64", help="default float64 (here)")

    attn = argparse.ArgumentParser(add_help=False)
    for name in ("query", "key", "value"):
        attn.add_argument(f"--{name}", required=True, help=TENSOR_HELP)
    _attention_options(attn)
    attn.add_argument("--scale", type=float, help="default 1/sqrt(E)")
    attn.add_argument("--engine", choices=["auto", "numpy", "onnx"], help="default auto")

    att = sub.add_parser(
        "attention",
        parents=[common, attn, norm, precision],
        help="attention output and weights of Q, K, V (POST /v1/attention)",
        description="Compute attention; print the output and the weights with their diagnostics.",
    )
    att.add_argument(
        "--return",
        dest="returns",
        type=_choices(ATTENTION_RETURNS),
        default=["output", "weights", "diagnostics"],
        help=f"comma-separated, of {', '.join(ATTENTION_RETURNS)} (default output,weights,diagnostics)",
    )

    back = sub.add_parser(
        "backward",
        parents=[common, attn, norm, precision],
        help="gradients of attention with respect to its inputs (POST /v1/attention/backward)",
        description="Gradients of sum(output * grad_output) (+ sum(weights * grad_weights)).",
    )
    back.add_argument("--grad-output", required=True, help="the upstream gradient, the output's shape; " + TENSOR_HELP)
    back.add_argument("--grad-weights", help="an upstream gradient on the weights; " + TENSOR_HELP)
    back.add_argument(
        "--return",
        dest="returns",
        type=_choices(BACKWARD_RETURNS),
        help=f"comma-separated, of {', '.join(BACKWARD_RETURNS)} (default grad_query,grad_key,grad_value)",
    )

    soft = sub.add_parser(
        "softmax",
        parents=[common, norm, precision],
        help="normalize a row of scores (softmax, sparsemax, entmax, relu; POST /v1/softmax)",
        description="Normalize scores and print each probability as a bar, with entropy and support.",
    )
    soft.add_argument("--scores", "--logits", dest="scores", required=True, help=TENSOR_HELP)
    soft.add_argument("--axis", type=int, help="the axis that sums to 1 (default -1)")
    soft.add_argument("--mask", help="boolean keep-mask or additive float mask; " + TENSOR_HELP)
    soft.add_argument("--log", action="store_true", help="also print log-probabilities (softmax only)")

    ana = sub.add_parser(
        "analyze",
        parents=[common],
        help="entropy, saturation and Jacobian norms over scales and temperatures (POST /v1/attention/analyze)",
        description="Sweep scales and temperatures on the given query and key, or on ones drawn for --shape.",
    )
    ana.add_argument("--query", help="with --key, or neither (and --shape); " + TENSOR_HELP)
    ana.add_argument("--key", help=TENSOR_HELP)
    ana.add_argument("--shape", help="B,H,L,E: draw query and key of this shape")
    ana.add_argument("--distribution", choices=["normal"], help="of the drawn entries (default normal)")
    ana.add_argument("--seed", type=int, help="seed of the draw (default 0)")
    ana.add_argument("--scales", help="scales to sweep, e.g. 0.125,1 (default 1/sqrt(E) and 1)")
    ana.add_argument("--temperatures", help="temperatures to sweep, e.g. 0.5,1,2")
    ana.add_argument("--head-dims", help="head dimensions to sweep (drawn inputs only), e.g. 16,64")
    ana.add_argument("--normalizer", choices=NORMALIZERS, help="default softmax")
    ana.add_argument("--alpha", type=float, help="for --normalizer entmax (alpha > 1)")
    _attention_options(ana)
    ana.add_argument("--vanishing-threshold", type=float, help="a row's gradient vanishes below this Jacobian norm")

    samp = sub.add_parser(
        "sample",
        parents=[common],
        help="filter logits (top-k, top-p, min-p, penalties) and draw tokens (POST /v1/sample)",
        description="The final distribution, the tokens drawn and their log-probabilities.",
    )
    samp.add_argument("--logits", "--scores", dest="logits", required=True, help=TENSOR_HELP)
    samp.add_argument("--temperature", type=float, help="0 = greedy (default 1)")
    samp.add_argument("--top-k", type=int, help="default 0 (all)")
    samp.add_argument("--top-p", type=float, help="default 1 (all)")
    samp.add_argument("--min-p", type=float, help="default 0 (none)")
    samp.add_argument("--repetition-penalty", type=float, help="default 1")
    samp.add_argument("--presence-penalty", type=float, help="default 0")
    samp.add_argument("--frequency-penalty", type=float, help="default 0")
    samp.add_argument("--previous-tokens", help="token ids already generated, e.g. 0,2,2 (one row per ';')")
    samp.add_argument("--mask", help="boolean (true = may be drawn) or additive float mask; " + TENSOR_HELP)
    samp.add_argument("-n", type=int, help="samples per row (default 1)")
    samp.add_argument("--seed", type=int)
    samp.add_argument("--top-logprobs", type=int, help="most probable tokens to list per row (default 0)")
    samp.add_argument("--precision", choices=PRECISIONS, help="default float32")
    samp.add_argument(
        "--return",
        dest="returns",
        type=_choices(SAMPLE_RETURNS),
        default=["tokens", "logprobs", "probabilities", "diagnostics"],
        help=f"comma-separated, of {', '.join(SAMPLE_RETURNS)} (default tokens,logprobs,probabilities,diagnostics)",
    )

    cal = sub.add_parser(
        "calibrate",
        parents=[common],
        help="fit a temperature to classifier logits and labels (POST /v1/calibrate)",
        description="Temperature scaling: the fitted T, NLL and ECE before and after, and the reliability bins.",
    )
    cal.add_argument("--logits", required=True, help="(N, C); " + TENSOR_HELP)
    cal.add_argument("--labels", required=True, help="N class indices: inline (0,2,1) or a file; " + TENSOR_HELP)
    cal.add_argument("--method", choices=["temperature"], help="default temperature")
    cal.add_argument("--bins", type=int, help="equal-width confidence bins (default 15)")


def _attention_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--mask", help="boolean (true = may attend) or additive float mask; " + TENSOR_HELP)
    parser.add_argument("--causal", choices=CAUSAL, help="default false")
    parser.add_argument("--key-lengths", help="valid keys per batch entry, e.g. 3,2")
