"""Requests of attention sessions (no I/O: the sync and async sessions share them): ids, paths and step bodies.

Checked as :mod:`attention_client._requests` checks its bodies (the same helpers), and ids also for what a /v1
path can name: the server reads a path of digits as an integer id, and no path carries ``/``, ``.`` or ``..``.
"""

from __future__ import annotations

import numbers
import uuid
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

import numpy.typing as npt

from attention_client import _arguments as check
from attention_client.errors import invalid_input
from attention_client.types import EngineName, Normalizer, Precision

UINT64_MAX = (1 << 64) - 1


def session_id(sequence_id: Any) -> int | str:
    """A session's id as /v1 can name it in a path (a fresh ``session-<hex>`` string for None), else
    :class:`ValidationError`: the server reads a path of digits as an integer id, so an integer must be in
    1 .. 2^64 - 1 (``-5`` or ``2**64`` would reach it as a string) and a string must not be one of those digits
    (``"7"`` would name the integer 7), nor empty, ``.``, ``..``, or hold a ``/`` (no path carries them).
    """
    if sequence_id is None:
        return f"session-{uuid.uuid4().hex}"
    if isinstance(sequence_id, str):
        text = sequence_id
        if text in ("", ".", "..") or "/" in text:
            raise invalid_input("sequence_id", f"{text!r}: a path cannot carry it (empty, '.', '..' or a '/')")
        if text.isascii() and text.isdigit() and (text == "0" or text[0] != "0") and int(text) <= UINT64_MAX:
            raise invalid_input(
                "sequence_id", f"{text!r} would name the integer id {int(text)} (a path of digits is an integer id)"
            )
        return text
    value = check.as_int(sequence_id, "sequence_id") if isinstance(sequence_id, numbers.Integral) else None
    if value is None or not 1 <= value <= UINT64_MAX:
        raise invalid_input("sequence_id", f"expected an integer in 1 .. 2^64 - 1 or a string, got {sequence_id!r}")
    return value


def session_path(sequence_id: int | str) -> str:
    """``/v1/sessions/{sequence_id}`` (DELETE ends it; ``+ "/steps"`` is the step route)."""
    return f"/v1/sessions/{quote(str(sequence_id), safe='')}"


def routing_headers(sequence_id: int | str) -> dict[str, str]:
    """``X-Sequence-ID``, on every request of a session: a proxy in front of several replicas hashes it to send all
    of a sequence's steps to the replica that holds its cache (docs/guides/sessions.md#several-workers-and-replicas).
    The id as its path segment writes it (``str(id)`` for most ids; percent-escaped beyond ASCII).
    """
    return {"x-sequence-id": quote(str(sequence_id), safe="")}


def session_options(
    *,
    scale: float | None = None,
    temperature: float | None = None,
    normalizer: Normalizer | None = None,
    alpha: float | None = None,
    engine: EngineName | None = None,
    precision: Precision | None = None,
    window: int | None = None,
    sinks: int | None = None,
    sink_positions: int | None = None,
) -> dict[str, Any]:
    """A session's scalar options as a step sends them (those left at None are not sent)."""
    return check.put(
        {},
        scale=check.opt_float(scale, "scale"),
        temperature=check.opt_float(temperature, "temperature"),
        normalizer=normalizer,
        alpha=check.opt_float(alpha, "alpha"),
        engine=engine,
        precision=precision,
        window=check.opt_int(window, "window"),
        sinks=check.opt_int(sinks, "sinks"),
        sink_positions=check.opt_int(sink_positions, "sink_positions"),
    )


_AT_START = ("window", "sinks", "sink_positions")
"""Options the server reads at a sequence's start only (and refuses on a later step: window, sinks)."""


def session_step_body(
    query: npt.ArrayLike,
    key: npt.ArrayLike,
    value: npt.ArrayLike,
    *,
    start: bool,
    end: bool,
    mask: npt.ArrayLike | None,
    options: dict[str, Any],
    returns: Sequence[str] | None,
) -> dict[str, Any]:
    """A step's body, with ``options`` from :func:`session_options` (the retention with a start only)."""
    body = {
        "query": check.required_tensor(query, "query"),
        "key": check.required_tensor(key, "key"),
        "value": check.required_tensor(value, "value"),
        **{name: v for name, v in options.items() if start or name not in _AT_START},
    }
    return check.put(
        body,
        start=True if start else None,
        end=True if end else None,
        mask=check.tensor(mask, "mask"),
        encoding="base64",
        **{"return": None if returns is None else list(returns)},
    )
