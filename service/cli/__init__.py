"""``python -m service attention|softmax|sample``: one-off answers at a terminal.

Against a running service (``--url``, default ``$ATTENTION_URL`` or http://127.0.0.1:8000, API key from
``$ATTENTION_API_KEY``) or in this process (``--local``: the same app, no server). A table of the
weights with the diagnostics, or ``--json`` for machines. Exit status: 0 done, 1 the service refused
the request (its detail on stderr) or could not be reached, 2 a usage error.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Callable
from typing import Any

from attention_client import (
    API_KEY_ENV,
    AsyncAttentionClient,
    AttentionClient,
    RetryPolicy,
    ServiceError,
    TransportError,
)

from service.cli import render
from service.cli.inputs import InputError, read_ints, read_tensor

URL_ENV = "ATTENTION_URL"
NORMALIZERS = ["softmax", "sparsemax", "entmax15", "entmax", "relu"]
COMMANDS = ("attention", "softmax", "sample")

Call = Callable[[Any], Any]
"""A client method call: takes an (async or sync) client, returns the result (or an awaitable of it)."""


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


def _causal(text: str) -> bool | str:
    return {"false": False, "true": True}.get(text, text)


def _prepare(args: argparse.Namespace) -> tuple[Call, Callable[[Any], str]]:
    """The client call of the command and the text renderer of its result (reads the inputs: may raise InputError)."""
    if args.command == "softmax":
        logits = read_tensor(args.scores, "scores")
        mask = None if args.mask is None else read_tensor(args.mask, "mask", mask=True)
        kwargs: dict[str, Any] = {
            "axis": args.axis,
            "temperature": args.temperature,
            "normalizer": args.normalizer,
            "alpha": args.alpha,
            "mask": mask,
            "log": args.log,
            "precision": args.precision,
        }
        return (lambda c: c.softmax(logits, **kwargs)), (lambda r: render.softmax_text(r, logits))
    if args.command == "attention":
        q, k, v = (read_tensor(getattr(args, n), n) for n in ("query", "key", "value"))
        mask = None if args.mask is None else read_tensor(args.mask, "mask", mask=True)
        lengths = None if args.key_lengths is None else read_ints(args.key_lengths, "key-lengths")
        kwargs = {
            "mask": mask,
            "causal": _causal(args.causal),
            "key_lengths": lengths,
            "scale": args.scale,
            "temperature": args.temperature,
            "normalizer": args.normalizer,
            "alpha": args.alpha,
            "engine": args.engine,
            "precision": args.precision,
            "returns": ("output", "weights", "diagnostics"),
        }
        return (lambda c: c.attention(q, k, v, **kwargs)), render.attention_text
    logits = read_tensor(args.logits, "logits")
    previous = None if args.previous_tokens is None else read_ints(args.previous_tokens, "previous-tokens")
    kwargs = {
        "temperature": args.temperature,
        "top_k": args.top_k,
        "top_p": args.top_p,
        "min_p": args.min_p,
        "repetition_penalty": args.repetition_penalty,
        "presence_penalty": args.presence_penalty,
        "frequency_penalty": args.frequency_penalty,
        "previous_tokens": previous,
        "n": args.n,
        "seed": args.seed,
        "top_logprobs": args.top_logprobs,
        "returns": ("tokens", "logprobs", "probabilities", "diagnostics"),
    }
    return (lambda c: c.sample(logits, **kwargs)), render.sample_text


def _remote(args: argparse.Namespace, call: Call) -> Any:
    url = args.url or os.environ.get(URL_ENV) or "http://127.0.0.1:8000"
    with AttentionClient(url, api_key=os.environ.get(API_KEY_ENV) or None, timeout=args.timeout) as client:
        return call(client)


def _local(args: argparse.Namespace, call: Call) -> Any:
    """The app in this process, through httpx's ASGI transport (same validation and answers as a server)."""
    import httpx

    from service.app import create_app
    from service.settings import Settings

    wants_onnx = getattr(args, "engine", "auto") == "onnx"
    app = create_app(Settings(enable_onnx=wants_onnx, api_keys=None))

    async def run() -> Any:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            retry = RetryPolicy(max_retries=50, max_backoff_s=0.2)  # waits while the engines warm up
            async with AsyncAttentionClient("http://local", transport=transport, retry=retry) as client:
                for _ in range(600):
                    if await client.ready():
                        break
                    await asyncio.sleep(0.05)
                return await call(client)

    return asyncio.run(run())


def run(args: argparse.Namespace) -> int:
    """Run a computing subcommand; the exit status."""
    try:
        call, text = _prepare(args)
    except InputError as exc:
        print(f"python -m service {args.command}: error: {exc}", file=sys.stderr)
        return 2
    try:
        result = _local(args, call) if args.local else _remote(args, call)
    except TransportError as exc:
        print(f"error: could not reach the service: {exc.detail}", file=sys.stderr)
        return 1
    except ServiceError as exc:
        print(f"error: {exc.status} {exc.title}: {exc.detail}", file=sys.stderr)
        for err in exc.errors:
            print(f"  {'.'.join(str(p) for p in err.get('loc', []))}: {err.get('msg', '')}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(render.as_json(result), indent=2, allow_nan=False))
    else:
        sys.stdout.write(text(result))
    return 0


__all__ = ["COMMANDS", "add_subcommands", "run"]
