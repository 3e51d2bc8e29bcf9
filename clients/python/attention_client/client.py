"""The synchronous client."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Self, TypeVar

import httpx
import numpy.typing as npt

from attention_client import _requests
from attention_client._common import (
    DEFAULT_URL,
    RETRYABLE_TRANSPORT,
    Parser,
    base_headers,
    call_headers,
    check_get,
    resolve_api_key,
    result_or_error,
    retry_wait,
    transport_error,
)
from attention_client._version import __version__
from attention_client._wire import dumps
from attention_client.results import (
    AnalyzeResult,
    AttentionResult,
    BackwardResult,
    CalibrateResult,
    SampleResult,
    SoftmaxResult,
)
from attention_client.retry import NO_RETRY, RetryPolicy
from attention_client.types import (
    AttentionReturn,
    BackwardReturn,
    CalibrationMethod,
    Causal,
    Distribution,
    EngineName,
    Normalizer,
    Precision,
    SampleReturn,
)

T = TypeVar("T")

__all__ = ["AttentionClient"]


class AttentionClient:
    """Calls the service over HTTP; numpy arrays in, numpy arrays out (``b64`` on the wire both ways).

    ``api_key`` defaults to ``$ATTENTION_API_KEY``. ``timeout`` (seconds or an ``httpx.Timeout``)
    applies to each attempt; ``retry`` says how 503, 429 and connection failures are retried.
    ``compression=True`` lets the server gzip large answers (worth it on slow links only).
    ``transport`` (an ``httpx.BaseTransport``) or ``http`` (a ready ``httpx.Client``-like object,
    e.g. Starlette's ``TestClient``; not closed by this client) replace the default connection.
    """

    def __init__(
        self,
        base_url: str = DEFAULT_URL,
        *,
        api_key: str | None = None,
        timeout: float | httpx.Timeout = 30.0,
        retry: RetryPolicy | None = None,
        compression: bool = False,
        transport: httpx.BaseTransport | None = None,
        http: Any = None,
    ) -> None:
        self.retry = retry if retry is not None else RetryPolicy()
        self._headers = base_headers(resolve_api_key(api_key), compression, f"attention-client/{__version__}")
        self._owned = http is None
        self._http: Any = (
            http if http is not None else httpx.Client(base_url=base_url, timeout=timeout, transport=transport)
        )
        self._sleep = time.sleep

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection pool (not an ``http`` object passed in)."""
        if self._owned:
            self._http.close()

    # ------------------------------------------------------------------ plumbing

    def _send(
        self,
        method: str,
        path: str,
        body: bytes | None,
        headers: dict[str, str],
        timeout: Any,
        *,
        retrying: bool = True,
    ) -> Any:
        policy = self.retry if retrying else NO_RETRY
        kwargs: dict[str, Any] = {"headers": headers}
        if body is not None:
            kwargs["content"] = body
        if timeout is not None:
            kwargs["timeout"] = timeout
        retry = 0
        while True:
            try:
                response = self._http.request(method, path, **kwargs)
            except RETRYABLE_TRANSPORT as exc:
                wait = policy.delay(retry, None) if policy.retry_connection_errors else None
                if wait is None:
                    raise transport_error(exc, path) from exc
            except httpx.HTTPError as exc:
                raise transport_error(exc, path) from exc
            else:
                wait = retry_wait(policy, retry, response)
                if wait is None:
                    return response
            self._sleep(wait)
            retry += 1

    def _post(
        self, path: str, body: dict[str, Any], parse: Parser[T], request_id: str | None, timeout: float | None
    ) -> T:
        response = self._send("POST", path, dumps(body), call_headers(self._headers, request_id), timeout)
        return result_or_error(response, parse)

    def _get(self, path: str) -> Any:
        return self._send("GET", path, None, call_headers(self._headers, None), None)

    # ------------------------------------------------------------------ /v1

    def attention(
        self,
        query: npt.ArrayLike,
        key: npt.ArrayLike,
        value: npt.ArrayLike,
        *,
        mask: npt.ArrayLike | None = None,
        causal: Causal = False,
        key_lengths: Sequence[int] | None = None,
        scale: float | None = None,
        temperature: float = 1.0,
        normalizer: Normalizer = "softmax",
        alpha: float | None = None,
        engine: EngineName = "auto",
        precision: Precision = "float32",
        returns: Sequence[AttentionReturn] = ("output", "weights", "diagnostics"),
        request_id: str | None = None,
        timeout: float | None = None,
    ) -> AttentionResult:
        """``POST /v1/attention``. ``returns`` is the API's ``return`` field."""
        body = _requests.attention_body(
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
        return self._post(_requests.ATTENTION_PATH, body, AttentionResult.parse, request_id, timeout)

    def softmax(
        self,
        logits: npt.ArrayLike,
        *,
        axis: int = -1,
        temperature: float = 1.0,
        normalizer: Normalizer = "softmax",
        alpha: float | None = None,
        mask: npt.ArrayLike | None = None,
        log: bool = False,
        precision: Precision = "float32",
        request_id: str | None = None,
        timeout: float | None = None,
    ) -> SoftmaxResult:
        """``POST /v1/softmax``: probabilities along ``axis`` (and log-probabilities with ``log=True``)."""
        body = _requests.softmax_body(
            logits,
            axis=axis,
            temperature=temperature,
            normalizer=normalizer,
            alpha=alpha,
            mask=mask,
            log=log,
            precision=precision,
        )
        return self._post(_requests.SOFTMAX_PATH, body, SoftmaxResult.parse, request_id, timeout)

    def attention_backward(
        self,
        query: npt.ArrayLike,
        key: npt.ArrayLike,
        value: npt.ArrayLike,
        grad_output: npt.ArrayLike,
        *,
        grad_weights: npt.ArrayLike | None = None,
        mask: npt.ArrayLike | None = None,
        causal: Causal = False,
        key_lengths: Sequence[int] | None = None,
        scale: float | None = None,
        temperature: float = 1.0,
        normalizer: Normalizer = "softmax",
        alpha: float | None = None,
        engine: EngineName = "auto",
        precision: Precision = "float32",
        returns: Sequence[BackwardReturn] = ("grad_query", "grad_key", "grad_value"),
        request_id: str | None = None,
        timeout: float | None = None,
    ) -> BackwardResult:
        """``POST /v1/attention/backward``: gradients of a loss with upstream gradient ``grad_output``."""
        body = _requests.backward_body(
            query,
            key,
            value,
            grad_output,
            grad_weights=grad_weights,
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
        return self._post(_requests.BACKWARD_PATH, body, BackwardResult.parse, request_id, timeout)

    def analyze(
        self,
        query: npt.ArrayLike | None = None,
        key: npt.ArrayLike | None = None,
        *,
        shape: Sequence[int] | None = None,
        distribution: Distribution | None = None,
        seed: int | None = None,
        scales: Sequence[float] | None = None,
        temperatures: Sequence[float] | None = None,
        head_dims: Sequence[int] | None = None,
        normalizer: Normalizer | None = None,
        alpha: float | None = None,
        mask: npt.ArrayLike | None = None,
        causal: Causal | None = None,
        key_lengths: Sequence[int] | None = None,
        vanishing_threshold: float | None = None,
        request_id: str | None = None,
        timeout: float | None = None,
    ) -> AnalyzeResult:
        """``POST /v1/attention/analyze``: entropy, saturation and Jacobian norms over a sweep of scales and
        temperatures, on the given ``query``/``key`` or on ones drawn for ``shape`` ``[B, H, L, E]``.
        """
        body = _requests.analyze_body(
            query,
            key,
            shape=shape,
            distribution=distribution,
            seed=seed,
            scales=scales,
            temperatures=temperatures,
            head_dims=head_dims,
            normalizer=normalizer,
            alpha=alpha,
            mask=mask,
            causal=causal,
            key_lengths=key_lengths,
            vanishing_threshold=vanishing_threshold,
        )
        return self._post(_requests.ANALYZE_PATH, body, AnalyzeResult.parse, request_id, timeout)

    def sample(
        self,
        logits: npt.ArrayLike,
        *,
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
        min_p: float = 0.0,
        repetition_penalty: float = 1.0,
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        previous_tokens: Sequence[int] | Sequence[Sequence[int]] | None = None,
        mask: npt.ArrayLike | None = None,
        n: int = 1,
        seed: int | None = None,
        top_logprobs: int = 0,
        returns: Sequence[SampleReturn] = ("tokens", "logprobs", "diagnostics"),
        request_id: str | None = None,
        timeout: float | None = None,
    ) -> SampleResult:
        """``POST /v1/sample``: filter the logits (penalties, temperature, top-k, top-p, min-p) and draw tokens."""
        body = _requests.sample_body(
            logits,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            min_p=min_p,
            repetition_penalty=repetition_penalty,
            presence_penalty=presence_penalty,
            frequency_penalty=frequency_penalty,
            previous_tokens=previous_tokens,
            mask=mask,
            n=n,
            seed=seed,
            top_logprobs=top_logprobs,
            returns=returns,
        )
        return self._post(_requests.SAMPLE_PATH, body, SampleResult.parse, request_id, timeout)

    def calibrate(
        self,
        logits: npt.ArrayLike,
        labels: Sequence[int] | npt.ArrayLike,
        *,
        method: CalibrationMethod = "temperature",
        bins: int = 15,
        request_id: str | None = None,
        timeout: float | None = None,
    ) -> CalibrateResult:
        """``POST /v1/calibrate``: fit a temperature to ``(N, C)`` logits and their ``labels``."""
        body = _requests.calibrate_body(logits, labels, method=method, bins=bins)
        return self._post(_requests.CALIBRATE_PATH, body, CalibrateResult.parse, request_id, timeout)

    # ------------------------------------------------------------------ operations

    def ready(self) -> bool:
        """True when ``GET /readyz`` answers 200 (no retries; a connection failure raises ``TransportError``)."""
        response = self._send("GET", "/readyz", None, call_headers(self._headers, None), None, retrying=False)
        return bool(response.status_code == 200)

    def health(self) -> dict[str, Any]:
        """``GET /healthz``."""
        return check_get(self._get("/healthz"))

    def engines(self) -> dict[str, Any]:
        """``GET /v1/engines``: engines, providers and versions."""
        return check_get(self._get("/v1/engines"))

    def models(self) -> dict[str, Any]:
        """``GET /v1/models``: the exported ONNX graphs and their hashes."""
        return check_get(self._get("/v1/models"))
