"""The attention operations of the asynchronous client: ``attention`` (the forward pass, its weights, diagnostics
and inspection) and ``attention_backward``, a mixin of :class:`~attention_client.AsyncAttentionClient`.

Like ``async_client.py``, this file is the one the code is written in: ``attention.py`` (the synchronous client's
``AttentionMixin``) is generated from it by ``clients/python/scripts/unasync.py``. Edit this file, then run the
script; a test checks that the two agree.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar, overload

import numpy.typing as npt

from attention_client import _requests
from attention_client._common import Parser
from attention_client.results import AttentionResult, BackwardResult, DefaultAttentionResult, DefaultBackwardResult
from attention_client.types import AttentionReturn, BackwardReturn, Causal, EngineName, Normalizer, Precision

T = TypeVar("T")

__all__ = ["AsyncAttentionMixin"]


class AsyncAttentionMixin:
    """``attention`` and ``attention_backward``: the client's operations on attention itself. They send through the
    client's ``_post`` (its connections, retries, API key and errors).
    """

    async def _post(
        self, path: str, body: dict[str, Any], parse: Parser[T], request_id: str | None, timeout: float | None
    ) -> T:
        raise NotImplementedError  # the client's own (the mixin is never used alone)

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
