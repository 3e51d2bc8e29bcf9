"""Request bodies of each endpoint (no I/O: the sync and async clients share them).

Options left at None are not sent, so the server's documented default applies.
Every tensor is sent in the ``b64`` form and, where the endpoint has the
``encoding`` option, asked back in it. Input the client can judge on its own is
checked before any request (:mod:`attention_client._arguments`); ranges and
shapes are the service's to judge.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from attention_client import _arguments as check
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
    sinks = check.opt_int(sink_positions, "sink_positions")
    bos = None if exclude_bos is None else check.flag(exclude_bos, "exclude_bos")
    current = None if exclude_current_token is None else check.flag(exclude_current_token, "exclude_current_token")
    body = {
        "query": check.required_tensor(query, "query"),
        "key": check.required_tensor(key, "key"),
        "value": check.required_tensor(value, "value"),
    }
    return check.put(
        body,
        mask=check.tensor(mask, "mask"),
        causal=check.causal_option(causal),
        key_lengths=check.int_list(key_lengths, "key_lengths"),
        scale=check.opt_float(scale, "scale"),
        temperature=check.opt_float(temperature, "temperature"),
        normalizer=normalizer,
        alpha=check.opt_float(alpha, "alpha"),
        engine=engine,
        precision=precision,
        encoding="base64",
        **{"return": None if returns is None else list(returns)},
        sink_positions=None if sinks == DEFAULT_SINK_POSITIONS else sinks,
        token_ids=check.token_id_rows(token_ids),
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
    return check.put(
        {"logits": check.required_tensor(logits, "logits")},
        axis=check.opt_int(axis, "axis"),
        temperature=check.opt_float(temperature, "temperature"),
        normalizer=normalizer,
        alpha=check.opt_float(alpha, "alpha"),
        mask=check.tensor(mask, "mask"),
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
    return check.put(
        body,
        grad_output=check.required_tensor(grad_output, "grad_output"),
        grad_weights=check.tensor(grad_weights, "grad_weights"),
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
    return check.put(
        {},
        query=check.tensor(query, "query"),
        key=check.tensor(key, "key"),
        shape=check.int_list(shape, "shape"),
        distribution=distribution,
        seed=check.opt_int(seed, "seed"),
        scales=check.float_list(scales, "scales"),
        temperatures=check.float_list(temperatures, "temperatures"),
        head_dims=check.int_list(head_dims, "head_dims"),
        normalizer=normalizer,
        alpha=check.opt_float(alpha, "alpha"),
        mask=check.tensor(mask, "mask"),
        causal=check.causal_option(causal),
        key_lengths=check.int_list(key_lengths, "key_lengths"),
        vanishing_threshold=check.opt_float(vanishing_threshold, "vanishing_threshold"),
    )


def _stack(value: npt.ArrayLike, field: str) -> npt.NDArray[Any]:
    """A rollout tensor: numbers (not booleans) of shape ``[layers, B, H, L, L]``."""
    array = check.as_array(value, field)
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
    picked = check.int_list(rows, "rows")
    if picked is not None and not picked:
        raise invalid_input("rows", "empty: leave rows out (None) for every row")
    return check.put(
        {"weights": encode_tensor(stack)},
        gradients=None if grads is None else encode_tensor(grads),
        head_fusion=head_fusion,
        residual=check.as_float(residual, "residual"),
        discard_ratio=check.as_float(discard_ratio, "discard_ratio"),
        rows=picked,
        renormalize=check.flag(renormalize, "renormalize"),
        top_k=None if top_k is None else check.as_int(top_k, "top_k"),
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
        check.int_list(row, "previous_tokens")
        if isinstance(row, Sequence | np.ndarray)
        else check.as_int(row, "previous_tokens")
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
    return check.put(
        {"logits": check.required_tensor(logits, "logits")},
        temperature=check.opt_float(temperature, "temperature"),
        top_k=check.opt_int(top_k, "top_k"),
        top_p=check.opt_float(top_p, "top_p"),
        min_p=check.opt_float(min_p, "min_p"),
        repetition_penalty=check.opt_float(repetition_penalty, "repetition_penalty"),
        presence_penalty=check.opt_float(presence_penalty, "presence_penalty"),
        frequency_penalty=check.opt_float(frequency_penalty, "frequency_penalty"),
        previous_tokens=_previous(previous_tokens),
        mask=check.tensor(mask, "mask"),
        n=check.opt_int(n, "n"),
        seed=check.opt_int(seed, "seed"),
        top_logprobs=check.opt_int(top_logprobs, "top_logprobs"),
        precision=precision,
        encoding="base64",
        **{"return": None if returns is None else list(returns)},
    )


def calibrate_body(
    logits: npt.ArrayLike, labels: Sequence[int] | npt.ArrayLike, *, method: CalibrationMethod | None, bins: int | None
) -> dict[str, Any]:
    label_array = check.as_array(labels, "labels")
    return check.put(
        {
            "logits": check.required_tensor(logits, "logits"),
            "labels": [check.as_int(v, "labels") for v in label_array.ravel().tolist()],
        },
        method=method,
        bins=check.opt_int(bins, "bins"),
    )
