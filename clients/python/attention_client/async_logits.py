"""The logits operations of the asynchronous client: ``softmax``, ``sample`` and ``calibrate`` (final-output
logits), a mixin of :class:`~attention_client.AsyncAttentionClient`.

Like ``async_client.py``, this file is the one the code is written in: ``logits.py`` (the synchronous client's
``LogitsMixin``) is generated from it by ``clients/python/scripts/unasync.py``. Edit this file, then run the
script; a test checks that the two agree.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar, overload

import numpy.typing as npt

from attention_client import _requests
from attention_client._common import Parser
from attention_client.results import CalibrateResult, DefaultSampleResult, SampleResult, SoftmaxResult
from attention_client.types import CalibrationMethod, Normalizer, Precision, SampleReturn

T = TypeVar("T")

__all__ = ["AsyncLogitsMixin"]


class AsyncLogitsMixin:
    """``softmax``, ``sample`` and ``calibrate``: the client's operations on final-output logits. They send through the
    client's ``_post`` (its connections, retries, API key and errors).
    """

    async def _post(
        self, path: str, body: dict[str, Any], parse: Parser[T], request_id: str | None, timeout: float | None
    ) -> T:
        raise NotImplementedError  # the client's own (the mixin is never used alone)

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
