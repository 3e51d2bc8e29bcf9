"""Reading the service's JSON answers into the results' fields (no I/O; the result modules share it)."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from attention_client._wire import decode_tensor
from attention_client.errors import ServiceError

Array = npt.NDArray[Any]


def missing(result: object, names: tuple[str, ...]) -> None:
    """Raise when an answer to a default-``returns`` call lacks one of its outputs (a server out of step)."""
    absent = [n for n in names if getattr(result, n) is None]
    if absent:
        raise ServiceError(
            200,
            {"title": "unexpected answer", "detail": f"the answer lacks {', '.join(absent)}"},
            request_id=getattr(result, "request_id", None),
        )


def tensor(body: dict[str, Any], name: str, dtype: npt.DTypeLike = np.float64) -> Array | None:
    return decode_tensor(body[name], dtype) if body.get(name) is not None else None


def required_tensor(body: dict[str, Any], name: str, request_id: str | None) -> Array:
    """``body[name]`` as an array; an answer without it is a server out of step (:func:`missing`'s error)."""
    value = tensor(body, name)
    if value is None:
        raise ServiceError(
            200, {"title": "unexpected answer", "detail": f"the answer lacks {name}"}, request_id=request_id
        )
    return value


def timing(body: dict[str, Any]) -> dict[str, float]:
    value = body.get("timing_ms")
    return {str(k): float(v) for k, v in value.items()} if isinstance(value, dict) else {}


def number(body: dict[str, Any], name: str) -> float | None:
    value = body.get(name)
    return None if value is None else float(value)
