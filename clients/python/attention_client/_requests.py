"""Request bodies of each endpoint (no I/O: the sync and async clients share them).

Options left at None are not sent, so the server's documented default applies.
Every tensor is sent in the ``b64`` form and, where the endpoint has the
``encoding`` option, asked back in it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from attention_client._wire import encode_tensor
from attention_client.types import (
    BackwardReturn,
    CalibrationMethod,
    Causal,
    Distribution,
    EngineName,
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


def _put(body: dict[str, Any], **options: Any) -> dict[str, Any]:
    body.update({k: v for k, v in options.items() if v is not None})
    return body


def _tensor(array: npt.ArrayLike | None) -> dict[str, Any] | None:
    return None if array is None else encode_tensor(array)


def _ints(values: Sequence[int] | None) -> list[int] | None:
    return None if values is None else [int(v) for v in values]


def _floats(values: Sequence[float] | None) -> list[float] | None:
    return None if values is None else [float(v) for v in values]


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
) -> dict[str, Any]:
    body = {"query": encode_tensor(query), "key": encode_tensor(key), "value": encode_tensor(value)}
    return _put(
        body,
        mask=_tensor(mask),
        causal=causal,
        key_lengths=_ints(key_lengths),
        scale=scale,
        temperature=temperature,
        normalizer=normalizer,
        alpha=alpha,
        engine=engine,
        precision=precision,
        encoding="base64",
        **{"return": None if returns is None else list(returns)},
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
        {"logits": encode_tensor(logits)},
        axis=axis,
        temperature=temperature,
        normalizer=normalizer,
        alpha=alpha,
        mask=_tensor(mask),
        log=log,
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
    return _put(body, grad_output=encode_tensor(grad_output), grad_weights=_tensor(grad_weights))


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
        raise ValueError("give both query and key, or neither (and a shape to draw them)")
    if query is None and shape is None:
        raise ValueError("give query and key, or a shape [B, H, L, E] to draw them")
    return _put(
        {},
        query=_tensor(query),
        key=_tensor(key),
        shape=_ints(shape),
        distribution=distribution,
        seed=seed,
        scales=_floats(scales),
        temperatures=_floats(temperatures),
        head_dims=_ints(head_dims),
        normalizer=normalizer,
        alpha=alpha,
        mask=_tensor(mask),
        causal=causal,
        key_lengths=_ints(key_lengths),
        vanishing_threshold=vanishing_threshold,
    )


def _previous(tokens: Sequence[int] | Sequence[Sequence[int]] | None) -> list[Any] | None:
    if tokens is None:
        return None
    return [[int(t) for t in row] if isinstance(row, Sequence) else int(row) for row in tokens]


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
    returns: Sequence[SampleReturn] | None,
) -> dict[str, Any]:
    return _put(
        {"logits": encode_tensor(logits)},
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        min_p=min_p,
        repetition_penalty=repetition_penalty,
        presence_penalty=presence_penalty,
        frequency_penalty=frequency_penalty,
        previous_tokens=_previous(previous_tokens),
        mask=_tensor(mask),
        n=n,
        seed=seed,
        top_logprobs=top_logprobs,
        encoding="base64",
        **{"return": None if returns is None else list(returns)},
    )


def calibrate_body(
    logits: npt.ArrayLike, labels: Sequence[int] | npt.ArrayLike, *, method: CalibrationMethod | None, bins: int | None
) -> dict[str, Any]:
    return _put(
        {"logits": encode_tensor(logits), "labels": [int(v) for v in np.asarray(labels).ravel()]},
        method=method,
        bins=bins,
    )
