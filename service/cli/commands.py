"""Running the computing subcommands: read the inputs, call the service (or the app in this process),
print a table or JSON, and return the exit status.
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
from service.cli.args import URL_ENV
from service.cli.inputs import InputError, read_ints, read_tensor

Call = Callable[[Any], Any]
"""A client method call: takes an (async or sync) client, returns the result (or an awaitable of it)."""


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
