"""The asynchronous client (``asyncio``; one instance may serve many concurrent calls).

This file is the one the clients are written in: ``client.py`` (the synchronous client) is generated from
it by ``clients/python/scripts/unasync.py`` (``async def`` becomes ``def``, ``await`` goes, ``httpx.AsyncClient``
becomes ``httpx.Client``, ...). Edit this file, then run the script; a test checks that the two agree. ``analyze``
and ``rollout`` are written in ``async_analysis.py`` (the mixin ``AsyncAnalysisMixin``), generated the same way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Self, TypeVar, overload

import httpx
import numpy.typing as npt

from attention_client import _requests
from attention_client import async_session as _session
from attention_client._common import (
    DEFAULT_URL,
    RETRYABLE_TRANSPORT,
    UNSENT_TRANSPORT,
    Parser,
    base_headers,
    call_headers,
    check_get,
    normalize_base_url,
    resolve_api_key,
    result_or_error,
    retry_wait,
    transport_error,
)
from attention_client._version import __version__
from attention_client._wire import dumps
from attention_client.async_analysis import AsyncAnalysisMixin
from attention_client.errors import TransportError
from attention_client.results import (
    AttentionResult,
    BackwardResult,
    CalibrateResult,
    DefaultAttentionResult,
    DefaultBackwardResult,
    DefaultSampleResult,
    SampleResult,
    SoftmaxResult,
)
from attention_client.retry import NO_RETRY, RetryPolicy
from attention_client.types import (
    AttentionReturn,
    BackwardReturn,
    CalibrationMethod,
    Causal,
    EngineName,
    Normalizer,
    Precision,
    SampleReturn,
)

T = TypeVar("T")

__all__ = ["AsyncAttentionClient"]


class AsyncAttentionClient(AsyncAnalysisMixin):
    """Calls the service over HTTP from ``asyncio`` code; numpy arrays in, numpy arrays out (``b64`` on the wire).

    Use it as a context manager (or call :meth:`close`) so that its connections are closed. Every failure
    is a :class:`~attention_client.ServiceError`; input the client can tell is bad raises
    :class:`~attention_client.ValidationError` before any request is sent.
    """

    def __init__(
        self,
        base_url: str = DEFAULT_URL,
        *,
        api_key: str | None = None,
        timeout: float | httpx.Timeout = 30.0,
        retry: RetryPolicy | None = None,
        compression: bool = False,
        transport: httpx.AsyncBaseTransport | None = None,
        http: Any = None,
    ) -> None:
        """Make a client for the service at ``base_url``.

        Args:
            base_url: The service's address, ``http://host:port`` (a path prefix is kept). Without a scheme
                (``"127.0.0.1:8000"``, as tritonclient takes it) ``http://`` is assumed.
            api_key: Sent as ``Authorization: Bearer``; default ``$ATTENTION_API_KEY`` (empty: none).
            timeout: Seconds (or an ``httpx.Timeout``) for each attempt of a request; a call's own
                ``timeout`` replaces it.
            retry: How 503, 429 and connection failures are retried; default ``RetryPolicy()`` (3 retries,
                honouring ``Retry-After``). ``RetryPolicy(max_retries=0)`` turns retries off.
            compression: Let the server gzip its answers (worth it on slow links only; default off).
            transport: An ``httpx.AsyncBaseTransport`` to send requests through instead of the network, e.g.
                ``httpx.ASGITransport(app)`` for an app in this process.
            http: A ready ``httpx.AsyncClient`` (or one that quacks like it) to use as it is; this client does
                not close it. ``base_url``, ``timeout`` and ``transport`` are then ignored.

        """
        self.retry = retry if retry is not None else RetryPolicy()
        self._headers = base_headers(resolve_api_key(api_key), compression, f"attention-client/{__version__}")
        self._owned = http is None
        self._http: Any = (
            http
            if http is not None
            else httpx.AsyncClient(base_url=normalize_base_url(base_url), timeout=timeout, transport=transport)
        )
        self._sleep = asyncio.sleep

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the connection pool (not an ``http`` object passed in)."""
        if self._owned:
            await self._http.aclose()

    # ------------------------------------------------------------------ plumbing

    async def _send(
        self,
        method: str,
        path: str,
        body: bytes | None,
        headers: dict[str, str],
        timeout: Any,
        *,
        retrying: bool = True,
        replayable: bool = True,
    ) -> Any:
        """The answer to ``method path`` (a 2xx or an error answer that is not retried). ``replayable`` False: a
        request that changes the server's state (a session's step), sent again after a connection failure only when
        it cannot have reached the server.
        """
        policy = self.retry if retrying else NO_RETRY
        kwargs: dict[str, Any] = {"headers": headers}
        if body is not None:
            kwargs["content"] = body
        if timeout is not None:
            kwargs["timeout"] = timeout
        retry = 0
        while True:
            try:
                response = await self._http.request(method, path, **kwargs)
            except RETRYABLE_TRANSPORT as exc:
                resend = policy.retry_connection_errors and (replayable or isinstance(exc, UNSENT_TRANSPORT))
                wait = policy.delay(retry, None) if resend else None
                if wait is None:
                    raise transport_error(exc, path) from exc
            except httpx.HTTPError as exc:
                raise transport_error(exc, path) from exc
            else:
                wait = retry_wait(policy, retry, response)
                if wait is None:
                    return response
            await self._sleep(wait)
            retry += 1

    async def _post(
        self, path: str, body: dict[str, Any], parse: Parser[T], request_id: str | None, timeout: float | None
    ) -> T:
        response = await self._send("POST", path, dumps(body), call_headers(self._headers, request_id), timeout)
        return result_or_error(response, parse)

    async def _get(self, path: str) -> Any:
        return await self._send("GET", path, None, call_headers(self._headers, None), None)

    # ------------------------------------------------------------------ /v1

    @overload
    async def attention(
        self,
        query: npt.ArrayLike,
        key: npt.ArrayLike,
        value: npt.ArrayLike,
        *,
        mask: npt.ArrayLike | None = ...,
        causal: Causal = ...,
        key_lengths: Sequence[int] | None = ...,
        scale: float | None = ...,
        temperature: float = ...,
        normalizer: Normalizer = ...,
        alpha: float | None = ...,
        engine: EngineName = ...,
        precision: Precision = ...,
        returns: None = ...,
        sink_positions: int = ...,
        token_ids: npt.ArrayLike | None = ...,
        exclude_bos: bool = ...,
        exclude_current_token: bool = ...,
        request_id: str | None = ...,
        timeout: float | None = ...,
    ) -> DefaultAttentionResult: ...

    @overload
    async def attention(
        self,
        query: npt.ArrayLike,
        key: npt.ArrayLike,
        value: npt.ArrayLike,
        *,
        mask: npt.ArrayLike | None = ...,
        causal: Causal = ...,
        key_lengths: Sequence[int] | None = ...,
        scale: float | None = ...,
        temperature: float = ...,
        normalizer: Normalizer = ...,
        alpha: float | None = ...,
        engine: EngineName = ...,
        precision: Precision = ...,
        returns: Sequence[AttentionReturn],
        sink_positions: int = ...,
        token_ids: npt.ArrayLike | None = ...,
        exclude_bos: bool = ...,
        exclude_current_token: bool = ...,
        request_id: str | None = ...,
        timeout: float | None = ...,
    ) -> AttentionResult: ...

    async def attention(
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
        returns: Sequence[AttentionReturn] | None = None,
        sink_positions: int = 4,
        token_ids: npt.ArrayLike | None = None,
        exclude_bos: bool = False,
        exclude_current_token: bool = False,
        request_id: str | None = None,
        timeout: float | None = None,
    ) -> AttentionResult:
        """``POST /v1/attention``: ``normalizer((scale * Q K^T + mask) / temperature) V`` per head.

        Args:
            query: ``(B, H, L, E)``, ``(H, L, E)`` or ``(L, E)``; float16/32/64 keep their dtype on the wire.
            key: ``(B, Hkv, S, E)`` with the query's rank; ``H`` a multiple of ``Hkv`` (grouped-query attention).
            value: ``(B, Hkv, S, Ev)``.
            mask: Broadcastable to ``(B, H, L, S)``: booleans (True = may attend) or an additive float mask.
            causal: ``True`` or ``"top_left"`` (query i sees keys up to i, PyTorch's ``is_causal``),
                ``"bottom_right"`` (the last query sees every key), or ``False``.
            key_lengths: Valid keys per batch entry (the rest are masked), e.g. ``[3, 2]``.
            scale: Multiplies ``Q K^T``; default ``1 / sqrt(E)``.
            temperature: Divides the scores (> 0).
            normalizer: ``"softmax"``, ``"sparsemax"``, ``"entmax15"``, ``"entmax"`` (with ``alpha``) or
                ``"relu"``.
            alpha: For ``normalizer="entmax"``: ``alpha > 1`` (2 is sparsemax, 1.5 is entmax15).
            engine: ``"auto"`` (the service picks), ``"numpy"`` or ``"onnx"``.
            precision: ``"float32"`` or ``"float64"``: the compute and answer dtype.
            returns: What to send back, of ``"output"``, ``"weights"``, ``"scores"``, ``"diagnostics"``,
                ``"gradient_health"``, ``"inspection"`` (per-head sink mass, spectral norm, pattern scores) and
                ``"norm_weights"`` (``||A_ij v_j||``) (the API's ``return`` field). Default (None): output, weights
                and diagnostics, as a :class:`~attention_client.DefaultAttentionResult` whose fields for them are
                never None.
            sink_positions: With ``"inspection"``: ``sink_mass`` is each head's mean weight on keys 0 to
                ``sink_positions - 1``. Sent only when it is not 4 (the service's default).
            token_ids: With ``"inspection"``: ``(B, S)`` integer token ids (``L == S``), for the previous-token,
                duplicate-token and induction scores (TransformerLens' head detector, "mul"). A ragged list or
                non-integers raise :class:`~attention_client.ValidationError` before sending.
            exclude_bos: The pattern scores leave the first key's column out. Sent only when True.
            exclude_current_token: The pattern scores leave the diagonal out. Sent only when True.
            request_id: Sent as ``X-Request-ID`` (the answer's id is the result's ``request_id``).
            timeout: Seconds for each attempt of this call; default the client's.

        Returns:
            The arrays asked for (others None), the diagnostics, the engine that ran it and the timings.

        Raises:
            ValidationError: Bad input (before sending) or a 400/422 answer.
            ServiceError: Any other failure (its subclasses say which).

        """
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
            sink_positions=sink_positions,
            token_ids=token_ids,
            exclude_bos=exclude_bos,
            exclude_current_token=exclude_current_token,
        )
        parse = AttentionResult.parse if returns is not None else DefaultAttentionResult.parse
        return await self._post(_requests.ATTENTION_PATH, body, parse, request_id, timeout)

    async def softmax(
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
        """``POST /v1/softmax``: probabilities along ``axis`` (and log-probabilities with ``log=True``).

        Args:
            logits: Scores of any shape (a single row, or rows of it).
            axis: The axis that sums to 1.
            temperature: Divides the logits (> 0).
            normalizer: ``"softmax"``, ``"sparsemax"``, ``"entmax15"``, ``"entmax"`` (with ``alpha``) or
                ``"relu"``.
            alpha: For ``normalizer="entmax"``: ``alpha > 1``.
            mask: Broadcastable to ``logits``: booleans (True = keep) or an additive float mask.
            log: Also return ``log_probabilities`` (softmax only).
            precision: ``"float32"`` or ``"float64"``.
            request_id: Sent as ``X-Request-ID``.
            timeout: Seconds for each attempt of this call; default the client's.

        Returns:
            ``probabilities`` (always), ``log_probabilities`` (with ``log=True``, else None) and the per-row
            diagnostics (entropy, max, argmax).

        Raises:
            ValidationError: Bad input (before sending) or a 400/422 answer.
            ServiceError: Any other failure.

        """
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
        return await self._post(_requests.SOFTMAX_PATH, body, SoftmaxResult.parse, request_id, timeout)

    @overload
    async def attention_backward(
        self,
        query: npt.ArrayLike,
        key: npt.ArrayLike,
        value: npt.ArrayLike,
        grad_output: npt.ArrayLike,
        *,
        grad_weights: npt.ArrayLike | None = ...,
        mask: npt.ArrayLike | None = ...,
        causal: Causal = ...,
        key_lengths: Sequence[int] | None = ...,
        scale: float | None = ...,
        temperature: float = ...,
        normalizer: Normalizer = ...,
        alpha: float | None = ...,
        engine: EngineName = ...,
        precision: Precision = ...,
        returns: None = ...,
        request_id: str | None = ...,
        timeout: float | None = ...,
    ) -> DefaultBackwardResult: ...

    @overload
    async def attention_backward(
        self,
        query: npt.ArrayLike,
        key: npt.ArrayLike,
        value: npt.ArrayLike,
        grad_output: npt.ArrayLike,
        *,
        grad_weights: npt.ArrayLike | None = ...,
        mask: npt.ArrayLike | None = ...,
        causal: Causal = ...,
        key_lengths: Sequence[int] | None = ...,
        scale: float | None = ...,
        temperature: float = ...,
        normalizer: Normalizer = ...,
        alpha: float | None = ...,
        engine: EngineName = ...,
        precision: Precision = ...,
        returns: Sequence[BackwardReturn],
        request_id: str | None = ...,
        timeout: float | None = ...,
    ) -> BackwardResult: ...

    async def attention_backward(
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
        returns: Sequence[BackwardReturn] | None = None,
        request_id: str | None = None,
        timeout: float | None = None,
    ) -> BackwardResult:
        """``POST /v1/attention/backward``: gradients of ``sum(output * grad_output)`` (plus
        ``sum(weights * grad_weights)``) with respect to the inputs.

        Args:
            query: As for :meth:`attention`.
            key: As for :meth:`attention`.
            value: As for :meth:`attention`.
            grad_output: The upstream gradient, the output's shape ``(B, H, L, Ev)``.
            grad_weights: An upstream gradient on the weights, ``(B, H, L, S)``; optional.
            mask: As for :meth:`attention`; a float mask gets ``grad_mask``.
            causal: As for :meth:`attention`.
            key_lengths: As for :meth:`attention`.
            scale: As for :meth:`attention`.
            temperature: As for :meth:`attention`.
            normalizer: As for :meth:`attention`.
            alpha: As for :meth:`attention`.
            engine: As for :meth:`attention`.
            precision: As for :meth:`attention`.
            returns: What to send back, of ``"grad_query"``, ``"grad_key"``, ``"grad_value"``, ``"grad_mask"``,
                ``"grad_scale"``, ``"grad_temperature"``, ``"output"``, ``"weights"``, ``"gradient_health"``,
                ``"head_importance"`` (``(B, H)``: ``|sum(grad_output * output)|`` per head, Michel et al. 2019).
                Default (None): the three input gradients, as a
                :class:`~attention_client.DefaultBackwardResult` whose fields for them are never None.
            request_id: Sent as ``X-Request-ID``.
            timeout: Seconds for each attempt of this call; default the client's.

        Returns:
            The gradients asked for (others None), the engine and the timings.

        Raises:
            ValidationError: Bad input (before sending) or a 400/422 answer.
            ServiceError: Any other failure.

        """
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
        parse = BackwardResult.parse if returns is not None else DefaultBackwardResult.parse
        return await self._post(_requests.BACKWARD_PATH, body, parse, request_id, timeout)

    @overload
    async def sample(
        self,
        logits: npt.ArrayLike,
        *,
        temperature: float = ...,
        top_k: int = ...,
        top_p: float = ...,
        min_p: float = ...,
        repetition_penalty: float = ...,
        presence_penalty: float = ...,
        frequency_penalty: float = ...,
        previous_tokens: Sequence[int] | Sequence[Sequence[int]] | None = ...,
        mask: npt.ArrayLike | None = ...,
        n: int = ...,
        seed: int | None = ...,
        top_logprobs: int = ...,
        precision: Precision = ...,
        returns: None = ...,
        request_id: str | None = ...,
        timeout: float | None = ...,
    ) -> DefaultSampleResult: ...

    @overload
    async def sample(
        self,
        logits: npt.ArrayLike,
        *,
        temperature: float = ...,
        top_k: int = ...,
        top_p: float = ...,
        min_p: float = ...,
        repetition_penalty: float = ...,
        presence_penalty: float = ...,
        frequency_penalty: float = ...,
        previous_tokens: Sequence[int] | Sequence[Sequence[int]] | None = ...,
        mask: npt.ArrayLike | None = ...,
        n: int = ...,
        seed: int | None = ...,
        top_logprobs: int = ...,
        precision: Precision = ...,
        returns: Sequence[SampleReturn],
        request_id: str | None = ...,
        timeout: float | None = ...,
    ) -> SampleResult: ...

    async def sample(
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
        precision: Precision = "float32",
        returns: Sequence[SampleReturn] | None = None,
        request_id: str | None = None,
        timeout: float | None = None,
    ) -> SampleResult:
        """``POST /v1/sample``: filter the logits (penalties, temperature, top-k, top-p, min-p) and draw tokens.

        Args:
            logits: ``(V,)`` or ``(N, V)``; finite.
            temperature: Divides the logits; 0 is greedy (the most probable token).
            top_k: Keep the ``top_k`` most probable tokens (0: all).
            top_p: Keep the smallest set of tokens whose probability reaches ``top_p`` (1: all).
            min_p: Drop tokens less probable than ``min_p`` times the most probable one (0: none).
            repetition_penalty: Divides positive (multiplies negative) logits of tokens already generated.
            presence_penalty: Subtracted once from the logit of each token that occurred.
            frequency_penalty: Subtracted times the token's count.
            previous_tokens: Token ids generated so far: one list for every row, or one list per row.
            mask: ``(V,)`` or ``(N, V)`` booleans (True = may be drawn) or an additive float mask.
            n: Draws per row.
            seed: Seed of the draws; default one the service picks (and returns as ``seed``).
            top_logprobs: How many of the most probable tokens to list per row (0: none).
            precision: ``"float32"`` or ``"float64"``: the compute dtype and that of the probabilities.
            returns: What to send back, of ``"tokens"``, ``"logprobs"``, ``"raw_logprobs"``, ``"top_logprobs"``,
                ``"probabilities"``, ``"diagnostics"``. Default (None): tokens, logprobs and diagnostics, as a
                :class:`~attention_client.DefaultSampleResult` whose fields for them are never None.
            request_id: Sent as ``X-Request-ID``.
            timeout: Seconds for each attempt of this call; default the client's.

        Returns:
            ``tokens`` (``(n,)`` or ``(N, n)``) and what else was asked for (others None), and the ``seed`` used.

        Raises:
            ValidationError: Bad input (before sending) or a 400/422 answer.
            ServiceError: Any other failure.

        """
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
            precision=precision,
            returns=returns,
        )
        parse = SampleResult.parse if returns is not None else DefaultSampleResult.parse
        return await self._post(_requests.SAMPLE_PATH, body, parse, request_id, timeout)

    async def calibrate(
        self,
        logits: npt.ArrayLike,
        labels: Sequence[int] | npt.ArrayLike,
        *,
        method: CalibrationMethod = "temperature",
        bins: int = 15,
        request_id: str | None = None,
        timeout: float | None = None,
    ) -> CalibrateResult:
        """``POST /v1/calibrate``: fit a temperature to classifier logits and their labels.

        Args:
            logits: ``(N, C)``: one row of class logits per example; finite.
            labels: ``N`` class indices in ``[0, C)``.
            method: ``"temperature"`` (temperature scaling, the one method).
            bins: Equal-width confidence bins of the reliability diagram and the ECE.
            request_id: Sent as ``X-Request-ID``.
            timeout: Seconds for each attempt of this call; default the client's.

        Returns:
            The fitted ``temperature`` (divide the logits by it), NLL and ECE before and after, the accuracy
            and the reliability bins.

        Raises:
            ValidationError: Bad input (before sending) or a 400/422 answer.
            ServiceError: Any other failure.

        """
        body = _requests.calibrate_body(logits, labels, method=method, bins=bins)
        return await self._post(_requests.CALIBRATE_PATH, body, CalibrateResult.parse, request_id, timeout)

    # ------------------------------------------------------------------ sessions

    def session(
        self,
        sequence_id: int | str | None = None,
        *,
        window: int | None = None,
        sinks: int | None = None,
        sink_positions: int | None = None,
        scale: float | None = None,
        temperature: float = 1.0,
        normalizer: Normalizer = "softmax",
        alpha: float | None = None,
        engine: EngineName = "auto",
        precision: Precision = "float32",
    ) -> _session.AsyncAttentionSession:
        """An attention session (``/v1/sessions``): the server keeps one sequence's keys and values, so that each
        step sends only its new positions. Nothing is sent until the first step; leaving ``async with`` ends it.

        ``async with client.session("chat-1") as s: r = await s.step(q, k, v)``: the first step starts the
        sequence, each later one appends to it (see :class:`~attention_client.AsyncAttentionSession`).

        Args:
            sequence_id: An integer in 1 .. 2^64 - 1 or a string (``7`` and ``"7"`` are two sequences on the
                server, and a string of such digits cannot be named on /v1: it is refused); None draws a fresh
                ``"session-<hex>"`` id.
            window: Keep only the sequence's first ``sinks`` positions and its last ``window`` others (StreamingLLM);
                default: every position. Sent with the start.
            sinks: With a ``window``: the first positions always kept (the server's default is 4).
            sink_positions: The diagnostics' ``sink_mass`` is each row's weight on the sequence's positions 0 to
                ``sink_positions - 1`` (the server's default is 4). Sent with the start.
            scale: Default for every step: multiplies ``Q K^T``; None is ``1 / sqrt(E)``.
            temperature: Default for every step: divides the scores (> 0).
            normalizer: Default for every step, as for :meth:`attention`.
            alpha: Default for every step: for ``normalizer="entmax"``, ``alpha > 1``.
            engine: Default for every step: ``"auto"``, ``"numpy"`` or ``"onnx"``.
            precision: ``"float32"`` or ``"float64"``: the cache's dtype, fixed at the start.

        Returns:
            The session, not yet started (its ``sequence_id`` is the id used).

        Raises:
            ValidationError: A ``sequence_id`` /v1 cannot name, or an option of the wrong type.

        """
        return _session.AsyncAttentionSession(
            self,
            sequence_id,
            window=window,
            sinks=sinks,
            sink_positions=sink_positions,
            scale=scale,
            temperature=temperature,
            normalizer=normalizer,
            alpha=alpha,
            engine=engine,
            precision=precision,
        )

    # ------------------------------------------------------------------ operations

    async def ready(self) -> bool:
        """True when ``GET /readyz`` answers 200; False for any other answer, and when no answer comes
        (connection refused, timed out): a probe, never retried and never raising.
        """
        try:
            response = await self._send("GET", "/readyz", None, call_headers(self._headers, None), None, retrying=False)
        except TransportError:
            return False
        return bool(response.status_code == 200)

    async def health(self) -> dict[str, Any]:
        """``GET /healthz``: the process answers (liveness)."""
        return check_get(await self._get("/healthz"))

    async def engines(self) -> dict[str, Any]:
        """``GET /v1/engines``: engines, providers and versions."""
        return check_get(await self._get("/v1/engines"))

    async def models(self) -> dict[str, Any]:
        """``GET /v1/models``: the exported ONNX graphs and their hashes."""
        return check_get(await self._get("/v1/models"))
