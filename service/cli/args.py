"""The arguments of the computing subcommands (imports nothing beyond the standard library, so that
``python -m service serve`` works in an install without the client's httpx).
"""

from __future__ import annotations

import argparse
from typing import Any

URL_ENV = "ATTENTION_URL"
NORMALIZERS = ["softmax", "sparsemax", "entmax15", "entmax", "relu"]
COMMANDS = ("attention", "softmax", "sample")


def add_subcommands(sub: Any) -> None:
    """Add the computing subcommands to ``python -m service``'s subparsers."""
    common = argparse.ArgumentParser(add_help=False)
    where = common.add_mutually_exclusive_group()
    where.add_argument("--url", help=f"the service (default ${URL_ENV} or http://127.0.0.1:8000)")
    where.add_argument("--local", action="store_true", help="compute in this process (no server needed)")
    common.add_argument("--json", action="store_true", help="print the result as JSON")
    common.add_argument("--timeout", type=float, default=60.0, help="seconds per attempt (default 60)")

    norm = argparse.ArgumentParser(add_help=False)
    norm.add_argument("--temperature", type=float, default=1.0, help="divides the scores (default 1)")
    norm.add_argument("--normalizer", choices=NORMALIZERS, default="softmax")
    norm.add_argument("--alpha", type=float, help="for --normalizer entmax (alpha > 1)")
    norm.add_argument("--precision", choices=["float32", "float64"], default="float64")

    tensor_help = "a .npy file, FILE.npz[:NAME], a .json file, or inline numbers (1,0.5;2,3)"
    att = sub.add_parser(
        "attention",
        parents=[common, norm],
        help="attention weights and output of Q, K, V",
        description="Compute attention and print the weights with their diagnostics.",
    )
    for name in ("query", "key", "value"):
        att.add_argument(f"--{name}", required=True, help=tensor_help)
    att.add_argument("--mask", help="boolean (true = may attend) or additive float mask; " + tensor_help)
    att.add_argument("--causal", choices=["false", "true", "top_left", "bottom_right"], default="false")
    att.add_argument("--key-lengths", help="valid keys per batch, e.g. 3,2")
    att.add_argument("--scale", type=float, help="default 1/sqrt(E)")
    att.add_argument("--engine", choices=["auto", "numpy", "onnx"], default="auto")

    soft = sub.add_parser(
        "softmax",
        parents=[common, norm],
        help="normalize a row of scores (softmax, sparsemax, entmax, relu)",
        description="Normalize scores and print each probability as a bar, with entropy and support.",
    )
    soft.add_argument("--scores", "--logits", dest="scores", required=True, help=tensor_help)
    soft.add_argument("--axis", type=int, default=-1)
    soft.add_argument("--mask", help="boolean keep-mask or additive float mask; " + tensor_help)
    soft.add_argument("--log", action="store_true", help="also print log-probabilities (softmax only)")

    samp = sub.add_parser(
        "sample",
        parents=[common],
        help="filter logits (top-k, top-p, min-p, penalties) and draw tokens",
        description="POST /v1/sample: the final distribution, the tokens drawn and their log-probabilities.",
    )
    samp.add_argument("--logits", "--scores", dest="logits", required=True, help=tensor_help)
    samp.add_argument("--temperature", type=float, default=1.0, help="0 = greedy")
    samp.add_argument("--top-k", type=int, default=0)
    samp.add_argument("--top-p", type=float, default=1.0)
    samp.add_argument("--min-p", type=float, default=0.0)
    samp.add_argument("--repetition-penalty", type=float, default=1.0)
    samp.add_argument("--presence-penalty", type=float, default=0.0)
    samp.add_argument("--frequency-penalty", type=float, default=0.0)
    samp.add_argument("--previous-tokens", help="token ids already generated, e.g. 0,2,2")
    samp.add_argument("-n", type=int, default=1, help="samples per row")
    samp.add_argument("--seed", type=int)
    samp.add_argument("--top-logprobs", type=int, default=0)
