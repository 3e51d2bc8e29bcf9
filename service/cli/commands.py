"""Running the computing commands: read the inputs into the request's fields (the HTTP API's names), send
them through the client (``--url``) or to the app in this process (``--local``), print a table or JSON,
and return the exit status.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from service.cli import render
from service.cli.inputs import (
    InputError,
    read_floats,
    read_int_rows,
    read_ints,
    read_labels,
    read_tensor,
)


@dataclass(frozen=True, slots=True)
class Command:
    path: str
    """The endpoint."""
    method: str
    """The client's method."""
    encoding: bool
    """The endpoint takes ``encoding`` (answers tensors in the ``b64`` form when asked)."""
    fields: Callable[[argparse.Namespace], dict[str, Any]]
    text: Callable[[dict[str, Any], dict[str, Any]], str]
    """The table of an answer (decoded), given the request's fields."""


def _tensor(args: argparse.Namespace, option: str, api: str | None = None, *, mask: bool = False) -> Any:
    text = getattr(args, option)
    return None if text is None else read_tensor(text, api or option, mask=mask)


def _causal(text: str | None) -> bool | str | None:
    return None if text is None else {"false": False, "true": True}.get(text, text)


def _ints(text: str | None, name: str) -> list[int] | None:
    return None if text is None else read_ints(text, name)


def _attention_fields(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "query": _tensor(args, "query"),
        "key": _tensor(args, "key"),
        "value": _tensor(args, "value"),
        "mask": _tensor(args, "mask", mask=True),
        "causal": _causal(args.causal),
        "key_lengths": _ints(args.key_lengths, "key-lengths"),
        "scale": args.scale,
        "temperature": args.temperature,
        "normalizer": args.normalizer,
        "alpha": args.alpha,
        "engine": args.engine,
        "precision": args.precision,
        "return": args.returns,
    }


def _backward_fields(args: argparse.Namespace) -> dict[str, Any]:
    fields = _attention_fields(args)
    fields["grad_output"] = _tensor(args, "grad_output", "grad-output")
    fields["grad_weights"] = _tensor(args, "grad_weights", "grad-weights")
    return fields


def _softmax_fields(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "logits": _tensor(args, "scores"),
        "axis": args.axis,
        "temperature": args.temperature,
        "normalizer": args.normalizer,
        "alpha": args.alpha,
        "mask": _tensor(args, "mask", mask=True),
        "log": True if args.log else None,
        "precision": args.precision,
    }


def _analyze_fields(args: argparse.Namespace) -> dict[str, Any]:
    if (args.query is None) != (args.key is None):
        raise InputError("give both --query and --key, or neither (and --shape)")
    if args.query is None and args.shape is None:
        raise InputError("give --query and --key, or --shape B,H,L,E to draw them")
    return {
        "query": _tensor(args, "query"),
        "key": _tensor(args, "key"),
        "shape": _ints(args.shape, "shape"),
        "distribution": args.distribution,
        "seed": args.seed,
        "scales": None if args.scales is None else read_floats(args.scales, "scales"),
        "temperatures": None if args.temperatures is None else read_floats(args.temperatures, "temperatures"),
        "head_dims": _ints(args.head_dims, "head-dims"),
        "normalizer": args.normalizer,
        "alpha": args.alpha,
        "mask": _tensor(args, "mask", mask=True),
        "causal": _causal(args.causal),
        "key_lengths": _ints(args.key_lengths, "key-lengths"),
        "vanishing_threshold": args.vanishing_threshold,
    }


def _sample_fields(args: argparse.Namespace) -> dict[str, Any]:
    previous = args.previous_tokens
    return {
        "logits": _tensor(args, "logits"),
        "temperature": args.temperature,
        "top_k": args.top_k,
        "top_p": args.top_p,
        "min_p": args.min_p,
        "repetition_penalty": args.repetition_penalty,
        "presence_penalty": args.presence_penalty,
        "frequency_penalty": args.frequency_penalty,
        "previous_tokens": None if previous is None else read_int_rows(previous, "previous-tokens"),
        "mask": _tensor(args, "mask", mask=True),
        "n": args.n,
        "seed": args.seed,
        "top_logprobs": args.top_logprobs,
        "precision": args.precision,
        "return": args.returns,
    }


def _calibrate_fields(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "logits": _tensor(args, "logits"),
        "labels": read_labels(args.labels, "labels"),
        "method": args.method,
        "bins": args.bins,
    }


COMMANDS: dict[str, Command] = {
    "attention": Command("/v1/attention", "attention", True, _attention_fields, render.attention_text),
    "backward": Command("/v1/attention/backward", "attention_backward", True, _backward_fields, render.backward_text),
    "softmax": Command("/v1/softmax", "softmax", True, _softmax_fields, render.softmax_text),
    "analyze": Command("/v1/attention/analyze", "analyze", False, _analyze_fields, render.analyze_text),
    "sample": Command("/v1/sample", "sample", True, _sample_fields, render.sample_text),
    "calibrate": Command("/v1/calibrate", "calibrate", False, _calibrate_fields, render.calibrate_text),
}


def _refused(status: int | None, title: str, detail: str, errors: list[dict[str, Any]]) -> None:
    print(f"error: {status} {title}: {detail}" if status is not None else f"error: {title}: {detail}", file=sys.stderr)
    for err in errors:
        print(f"  {'.'.join(str(p) for p in err.get('loc', []))}: {err.get('msg', '')}", file=sys.stderr)


def _local(command: Command, fields: dict[str, Any]) -> tuple[dict[str, Any], str | None] | int:
    from service.cli import local

    body = dict(fields, encoding="base64") if command.encoding else fields
    answer = local.call(command.path, body, onnx=fields.get("engine") == "onnx")
    data = answer.json()
    if answer.status >= 400 or not isinstance(data, dict):
        problem = data if isinstance(data, dict) else {}
        detail = str(problem.get("detail", answer.body[:300].decode("utf-8", "replace")))
        _refused(answer.status, str(problem.get("title", "")), detail, list(problem.get("errors") or []))
        return 1
    return data, answer.headers.get("x-request-id")


def _remote(prog: str, args: argparse.Namespace, command: Command, fields: dict[str, Any]) -> Any:
    try:
        from attention_client import ServiceError, TransportError

        from service.cli import remote
    except ImportError as exc:  # the client distribution, or its httpx, is not installed
        print(
            f"{prog} {args.command}: --url needs the Python client ({exc.name} is missing): "
            "pip install ./clients/python (the 'client' extra), or compute here with --local",
            file=sys.stderr,
        )
        return 2
    try:
        return remote.call(command.method, fields, url=args.url, timeout=args.timeout)
    except TransportError as exc:
        print(f"error: could not reach the service: {exc.detail}", file=sys.stderr)
        return 1
    except ServiceError as exc:
        _refused(exc.status, exc.title, exc.detail, exc.errors)
        return 2 if exc.status is None else 1  # status None: the client refused the input before sending


def run(args: argparse.Namespace, prog: str) -> int:
    """Run a computing command; the exit status."""
    command = COMMANDS[args.command]
    try:
        fields = command.fields(args)
    except InputError as exc:
        print(f"{prog} {args.command}: error: {exc}", file=sys.stderr)
        return 2
    outcome = _local(command, fields) if args.local else _remote(prog, args, command, fields)
    if isinstance(outcome, int):
        return outcome
    raw, request_id = outcome
    answer = render.decode_answer(raw)
    if args.json:
        sys.stdout.write(json.dumps(render.as_json({**answer, "request_id": request_id}), indent=2, allow_nan=False))
        sys.stdout.write("\n")
    else:
        sys.stdout.write(command.text(answer, fields))
    return 0
