"""Request bodies of each endpoint (no I/O: the sync and async clients share them).

Options left at None are not sent, so the server's documented default applies.
Every tensor is sent in the ``b64`` form and, where the endpoint has the
``encoding`` option, asked back in it.

Input the client can judge on its own is checked here, before any request: a
tensor must be a rectangular array of numbers or booleans (a ragged nested
list, text, ``None`` entries or complex numbers raise :class:`ValidationError`
naming the argument), integer options and lists must hold integers, and number
options must be numbers. Ranges and shapes are the service's to judge.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from attention_client._wire import encode_tensor
from attention_client.errors import invalid_input
from attention_client.types import (
    BackwardReturn,
    CalibrationMethod,
    Causal,
    Distribution,
    EngineName,
    HeadFusion,
    Normalizer,
    Precision,
    SampleReturn,
)

ATTENTION_PATH = "/v1/attention"
SOFTMAX_PATH = "/v1/softmax"
BACKWARD_PATH = "/v1/attention/backward"
ANALYZE_PATH = "/v1/attention/analyze"
SAMPLE_PATH = "/v1/sample"
CALIBRATE_PATH = "/v1/calibrate"
ROLLOUT_PATH = "/v1/attention/rollout"

DEFAULT_SINK_POSITIONS = 4
"""The service's default ``sink_positions`` (not sent: a default call's body stays as it was before inspection)."""

_NUMERIC_KINDS = frozenset("biuf")
"""numpy dtype kinds a tensor may have: bool, signed and unsigned integers, floats."""
_KIND_NAMES = {"U": "text", "S": "bytes", "O": "Python objects (None, mixed types)", "c": "complex numbers"}


def _put(body: dict[str, Any], **options: Any) -> dict[str, Any]:
    body.update({k: v for k, v in options.items() if v is not None})
    return body


def as_array(value: npt.ArrayLike, field: str) -> npt.NDArray[Any]:
    """``value`` as a numpy array of numbers or booleans, else :class:`ValidationError` naming ``field``."""
    try:
        array = np.asarray(value)
    except (ValueError, TypeError) as exc:  # numpy >= 1.24 refuses ragged nested lists with ValueError
        text = str(exc)
        if "inhomogeneous" in text or "sequence" in text:
            raise invalid_input(field, "a ragged nested list: every row must have the same length") from None
        raise invalid_input(field, f"not an array of numbers ({text})") from None
    if array.dtype.kind not in _NUMERIC_KINDS:
        what = _KIND_NAMES.get(array.dtype.kind, f"dtype {array.dtype}")
        raise invalid_input(field, f"must hold numbers (or booleans for a mask), got {what}")
    return array


def _tensor(array: npt.ArrayLike | None, field: str) -> dict[str, Any] | None:
    return None if array is None else encode_tensor(as_array(array, field))


def _required_tensor(array: npt.ArrayLike, field: str) -> dict[str, Any]:
    return encode_tensor(as_array(array, field))


def _int(value: Any, field: str) -> int:
    """An integer (a float with an integral value is accepted; a bool is not)."""
    if isinstance(value, bool | np.bool_):
        raise invalid_input(field, f"expected an integer, got {value!r}")
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real) and math.isfinite(float(value)) and float(value).is_integer():
        return int(float(value))
    raise invalid_input(field, f"expected an integer, got {value!r}")


def _float(value: Any, field: str) -> float:
    if isinstance(value, bool | np.bool_) or not isinstance(value, numbers.Real):
        raise invalid_input(field, f"expected a number, got {value!r}")
    return float(value)


def _opt_int(value: Any, field: str) -> int | None:
    return None if value is None else _int(value, field)


def _opt_float(value: Any, field: str) -> float | None:
    return None if value is None else _float(value, field)


def _ints(values: Any, field: str) -> list[int] | None:
    if values is None:
        return None
    if isinstance(values, str | bytes) or not isinstance(values, Sequence | np.ndarray):
        raise invalid_input(field, f"expected a list of integers, got {values!r}")
    return [_int(v, field) for v in values]


def _floats(values: Any, field: str) -> list[float] | None:
    if values is None:
        return None
    if isinstance(values, str | bytes) or not isinstance(values, Sequence | np.ndarray):
        raise invalid_input(field, f"expected a list of numbers, got {values!r}")
    return [_float(v, field) for v in values]


def _flag(value: Any, field: str) -> bool:
    if isinstance(value, bool | np.bool_):
        return bool(value)
    raise invalid_input(field, f"expected True or False, got {value!r}")


def _token_ids(value: Any) -> list[list[int]] | None:
    """``[B, S]`` token ids as lists of Python ints: a rectangular 2-D array of integers (integral floats pass)."""
    if value is None:
        return None
    if isinstance(value, str | bytes):
        raise invalid_input("token_ids", f"expected [B, S] integer token ids, got {value!r}")
    array = as_array(value, "token_ids")
    if array.ndim != 2:
        raise invalid_input("token_ids", f"expected [B, S] integer token ids (2 axes), got shape {list(array.shape)}")
    if array.dtype.kind == "b" or (
        array.dtype.kind == "f" and not (np.isfinite(array).all() and (array == np.round(array)).all())
    ):
        raise invalid_input("token_ids", f"expected integer token ids, got {array.dtype} values")
    return [[int(v) for v in row] for row in array.tolist()]


def _causal(value: Any) -> Causal | None:
    if value is None or isinstance(value, bool):
        return value
    if value in ("top_left", "bottom_right"):
        return value  # type: ignore[no-any-return]  # one of the two literals
    if isinstance(value, np.bool_):
        return bool(value)
    raise invalid_input("causal", f"expected True, False, 'top_left' or 'bottom_right', got {value!r}")


def attention_body(
    query: npt.ArrayLike,
    key: npt.ArrayLike,
    value: npt.ArrayLike,
    *,
    mask: npt.ArrayLike | None,
    causal: Causal | None,
    key_lengths: Sequence[int] | None,
    scale: float | None,
    temperature: float | None,
    normalizer: Normalizer | None,
    alpha: float | None,
    engine: EngineName | None,
    precision: Precision | None,
    returns: Sequence[str] | None,
    sink_positions: int | None = None,
    token_ids: npt.ArrayLike | None = None,
    exclude_bos: bool | None = None,
    exclude_current_token: bool | None = None,
) -> dict[str, Any]:
    """The body of ``/v1/attention``. The inspection's options (``sink_positions`` and after) are sent only when
    they differ from the service's defaults (4, none, False, False): a default call's body is what a server without
    the inspection takes, and the backward body, which has no such fields, is built from this one.
    """
    sinks = _opt_int(sink_positions, "sink_positions")
    bos = None if exclude_bos is None else _flag(exclude_bos, "exclude_bos")
    current = None if exclude_current_token is None else _flag(exclude_current_token, "exclude_current_token")
    body = {
        "query": _required_tensor(query, "query"),
        "key": _required_tensor(key, "key"),
        "value": _required_tensor(value, "value"),
    }
    return _put(
        body,
        mask=_tensor(mask, "mask"),
        causal=_causal(causal),
        key_lengths=_ints(key_lengths, "key_lengths"),
        scale=_opt_float(scale, "scale"),
        temperature=_opt_float(temperature, "temperature"),
        normalizer=normalizer,
        alpha=_opt_float(alpha, "alpha"),
        engine=engine,
        precision=precision,
        encoding="base64",
        **{"return": None if returns is None else list(returns)},
        sink_positions=None if sinks == DEFAULT_SINK_POSITIONS else sinks,
        token_ids=_token_ids(token_ids),
        exclude_bos=bos or None,
        exclude_current_token=current or None,
    )


def softmax_body(
    logits: npt.ArrayLike,
    *,
    axis: int | None,
    temperature: float | None,
    normalizer: Normalizer | None,
    alpha: float | None,
    mask: npt.ArrayLike | None,
    log: bool | None,
    precision: Precision | None,
) -> dict[str, Any]:
    return _put(
        {"logits": _required_tensor(logits, "logits")},
        axis=_opt_int(axis, "axis"),
        temperature=_opt_float(temperature, "temperature"),
        normalizer=normalizer,
        alpha=_opt_float(alpha, "alpha"),
        mask=_tensor(mask, "mask"),
        log=None if log is None else bool(log),
        precision=precision,
        encoding="base64",
    )


def backward_body(
    query: npt.ArrayLike,
    key: npt.ArrayLike,
    value: npt.ArrayLike,
    grad_output: npt.ArrayLike,
    *,
    grad_weights: npt.ArrayLike | None,
    mask: npt.ArrayLike | None,
    causal: Causal | None,
    key_lengths: Sequence[int] | None,
    scale: float | None,
    temperature: float | None,
    normalizer: Normalizer | None,
    alpha: float | None,
    engine: EngineName | None,
    precision: Precision | None,
    returns: Sequence[BackwardReturn] | None,
) -> dict[str, Any]:
    body = attention_body(
        query,
        key,
        value,
        mask=mask,
        causal=causal,
        key_lengths=key_lengths,
        scale=scale,
        temperature=temperature,
        normalizer=normalizer,
        alpha=alpha,
        engine=engine,
        precision=precision,
        returns=returns,
    )
    return _put(
        body,
        grad_output=_required_tensor(grad_output, "grad_output"),
        grad_weights=_tensor(grad_weights, "grad_weights"),
    )


def analyze_body(
    query: npt.ArrayLike | None,
    key: npt.ArrayLike | None,
    *,
    shape: Sequence[int] | None,
    distribution: Distribution | None,
    seed: int | None,
    scales: Sequence[float] | None,
    temperatures: Sequence[float] | None,
    head_dims: Sequence[int] | None,
    normalizer: Normalizer | None,
    alpha: float | None,
    mask: npt.ArrayLike | None,
    causal: Causal | None,
    key_lengths: Sequence[int] | None,
    vanishing_threshold: float | None,
) -> dict[str, Any]:
    if (query is None) != (key is None):
        raise invalid_input("query" if query is None else "key", "give both query and key, or neither (and a shape)")
    if query is None and shape is None:
        raise invalid_input("shape", "give query and key, or a shape [B, H, L, E] to draw them")
    return _put(
        {},
        query=_tensor(query, "query"),
        key=_tensor(key, "key"),
        shape=_ints(shape, "shape"),
        distribution=distribution,
        seed=_opt_int(seed, "seed"),
        scales=_floats(scales, "scales"),
        temperatures=_floats(temperatures, "temperatures"),
        head_dims=_ints(head_dims, "head_dims"),
        normalizer=normalizer,
        alpha=_opt_float(alpha, "alpha"),
        mask=_tensor(mask, "mask"),
        causal=_causal(causal),
        key_lengths=_ints(key_lengths, "key_lengths"),
        vanishing_threshold=_opt_float(vanishing_threshold, "vanishing_threshold"),
    )


def _stack(value: npt.ArrayLike, field: str) -> npt.NDArray[Any]:
    """A rollout tensor: numbers (not booleans) of shape ``[layers, B, H, L, L]``."""
    array = as_array(value, field)
    if array.dtype.kind == "b":
        raise invalid_input(field, "must hold numbers, got booleans")
    if array.ndim != 5:
        raise invalid_input(
            field, f"expected [layers, B, H, L, L] (5 axes: the layers' weights stacked), got shape {list(array.shape)}"
        )
    if array.shape[-1] != array.shape[-2]:
        raise invalid_input(field, f"the last two axes (L, L: queries and keys) differ, shape {list(array.shape)}")
    return array


def rollout_body(
    weights: npt.ArrayLike,
    *,
    gradients: npt.ArrayLike | None,
    head_fusion: HeadFusion,
    residual: float,
    discard_ratio: float,
    rows: Sequence[int] | None,
    renormalize: bool,
    precision: Precision,
    top_k: int | None = None,
) -> dict[str, Any]:
    """The body of ``/v1/attention/rollout``. Checked here: the weights' rank and square last axes, the gradients'
    shape (the weights'), ``rows`` a non-empty list of integers, ``top_k`` an integer; ranges and the weights'
    values are the service's.
    """
    stack = _stack(weights, "weights")
    grads = None if gradients is None else _stack(gradients, "gradients")
    if grads is not None and grads.shape != stack.shape:
        raise invalid_input(
            "gradients", f"shape {list(grads.shape)} is not the weights' {list(stack.shape)}: one gradient per weight"
        )
    picked = _ints(rows, "rows")
    if picked is not None and not picked:
        raise invalid_input("rows", "empty: leave rows out (None) for every row")
    return _put(
        {"weights": encode_tensor(stack)},
        gradients=None if grads is None else encode_tensor(grads),
        head_fusion=head_fusion,
        residual=_float(residual, "residual"),
        discard_ratio=_float(discard_ratio, "discard_ratio"),
        rows=picked,
        renormalize=_flag(renormalize, "renormalize"),
        top_k=None if top_k is None else _int(top_k, "top_k"),
        precision=precision,
        encoding="base64",
    )


def _previous(tokens: Any) -> list[Any] | None:
    """One list of token ids for every row, or one list per row (rows may differ in length)."""
    if tokens is None:
        return None
    if isinstance(tokens, str | bytes) or not isinstance(tokens, Sequence | np.ndarray):
        raise invalid_input("previous_tokens", f"expected a list of token ids (or one per row), got {tokens!r}")
    return [
        _ints(row, "previous_tokens") if isinstance(row, Sequence | np.ndarray) else _int(row, "previous_tokens")
        for row in tokens
    ]


def sample_body(
    logits: npt.ArrayLike,
    *,
    temperature: float | None,
    top_k: int | None,
    top_p: float | None,
    min_p: float | None,
    repetition_penalty: float | None,
    presence_penalty: float | None,
    frequency_penalty: float | None,
    previous_tokens: Sequence[int] | Sequence[Sequence[int]] | None,
    mask: npt.ArrayLike | None,
    n: int | None,
    seed: int | None,
    top_logprobs: int | None,
    precision: Precision | None,
    returns: Sequence[SampleReturn] | None,
) -> dict[str, Any]:
    return _put(
        {"logits": _required_tensor(logits, "logits")},
        temperature=_opt_float(temperature, "temperature"),
        top_k=_opt_int(top_k, "top_k"),
        top_p=_opt_float(top_p, "top_p"),
        min_p=_opt_float(min_p, "min_p"),
        repetition_penalty=_opt_float(repetition_penalty, "repetition_penalty"),
        presence_penalty=_opt_float(presence_penalty, "presence_penalty"),
        frequency_penalty=_opt_float(frequency_penalty, "frequency_penalty"),
        previous_tokens=_previous(previous_tokens),
        mask=_tensor(mask, "mask"),
        n=_opt_int(n, "n"),
        seed=_opt_int(seed, "seed"),
        top_logprobs=_opt_int(top_logprobs, "top_logprobs"),
        precision=precision,
        encoding="base64",
        **{"return": None if returns is None else list(returns)},
    )


def calibrate_body(
    logits: npt.ArrayLike, labels: Sequence[int] | npt.ArrayLike, *, method: CalibrationMethod | None, bins: int | None
) -> dict[str, Any]:
    label_array = as_array(labels, "labels")
    return _put(
        {
            "logits": _required_tensor(logits, "logits"),
            "labels": [_int(v, "labels") for v in label_array.ravel().tolist()],
        },
        method=method,
        bins=_opt_int(bins, "bins"),
    )
