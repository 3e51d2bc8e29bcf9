"""The analysis operations of the asynchronous client: ``analyze`` (sweeps of scale and temperature) and ``rollout``
(attention rollout across layers), a mixin of :class:`~attention_client.AsyncAttentionClient`.

Like ``async_client.py``, this file is the one the code is written in: ``analysis.py`` (the synchronous client's
``AnalysisMixin``) is generated from it by ``clients/python/scripts/unasync.py``. Edit this file, then run the
script; a test checks that the two agree.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

import numpy.typing as npt

from attention_client import _requests
from attention_client._common import Parser
from attention_client.results import AnalyzeResult, RolloutResult
from attention_client.types import Causal, Distribution, HeadFusion, Normalizer, Precision

T = TypeVar("T")

__all__ = ["AsyncAnalysisMixin"]


class AsyncAnalysisMixin:
    """``analyze`` and ``rollout``: the client's operations that summarise attention rather than compute it. They
    send through the client's ``_post`` (its connections, retries, API key and errors).
    """

    async def _post(
        self, path: str, body: dict[str, Any], parse: Parser[T], request_id: str | None, timeout: float | None
    ) -> T:
        raise NotImplementedError  # the client's own (the mixin is never used alone)

    async def analyze(
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
        temperatures. Options left at None take the service's defaults.

        Args:
            query: ``(B, H, L, E)``, ``(H, L, E)`` or ``(L, E)``; with ``key``, or neither (and ``shape``).
            key: ``(B, Hkv, S, E)``, the query's rank.
            shape: ``[B, H, L, E]``: draw query and key of this shape instead of sending them.
            distribution: Of the drawn entries: ``"normal"`` (standard normal).
            seed: Seed of the draw.
            scales: Scales to sweep; default ``1 / sqrt(E)`` and 1.
            temperatures: Temperatures to sweep (> 0).
            head_dims: Head dimensions to sweep (drawn inputs only).
            normalizer: As for :meth:`attention`.
            alpha: For ``normalizer="entmax"``: ``alpha > 1``.
            mask: As for :meth:`attention`.
            causal: As for :meth:`attention`.
            key_lengths: As for :meth:`attention`.
            vanishing_threshold: A row's gradient vanishes when its Jacobian norm is below this.
            request_id: Sent as ``X-Request-ID``.
            timeout: Seconds for each attempt of this call; default the client's.

        Returns:
            ``sweep``: one :class:`~attention_client.SweepRow` per (scale, temperature[, head_dim]).

        Raises:
            ValidationError: Bad input (before sending: query without key, neither and no shape) or a 400/422
                answer.
            ServiceError: Any other failure.

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
        return await self._post(_requests.ANALYZE_PATH, body, AnalyzeResult.parse, request_id, timeout)

    async def rollout(
        self,
        weights: npt.ArrayLike,
        *,
        gradients: npt.ArrayLike | None = None,
        head_fusion: HeadFusion = "mean",
        residual: float = 0.5,
        discard_ratio: float = 0.0,
        rows: Sequence[int] | None = None,
        renormalize: bool = False,
        top_k: int | None = None,
        precision: Precision = "float32",
        request_id: str | None = None,
        timeout: float | None = None,
    ) -> RolloutResult:
        """``POST /v1/attention/rollout``: attention rollout across layers (Abnar and Zuidema 2020), or its
        gradient-weighted form (Chefer et al. 2021) with ``gradients``.

        Per layer and batch entry: the heads fused (``head_fusion``), the lowest ``discard_ratio`` of the fused
        matrix set to 0 (never ``[0, 0]``), ``A_hat = residual * I + (1 - residual) * A_fused`` with its rows
        renormalised; the answer is ``A_hat[last] @ ... @ A_hat[first]``. The definitions, and where they differ
        from vit-explain on purpose: the service's docs, "Diagnostics", "Rollout".

        Args:
            weights: ``(layers, B, H, L, L)``: each layer's attention weights, first layer first; each row sums
                to 1, or to 0 (a fully masked query). float16/32/64 keep their dtype on the wire (the row-sum
                tolerance is the coarser of that dtype's and ``precision``'s).
            gradients: The weights' shape: the gradient of a loss with respect to each weight. Each layer is then
                fused as the mean over heads of ``relu(grad * A)``.
            head_fusion: ``"mean"``, ``"max"`` or ``"min"`` over the heads (with ``gradients``, ``"mean"`` only).
            residual: In ``[0, 1]``: the weight of the identity (the residual connection) in each layer.
            discard_ratio: In ``[0, 1]``: the fraction of each fused matrix's lowest entries set to 0.
            rows: Only these rows of the answer, e.g. ``[0]`` (a class token's) or ``[-1]`` (the last token's);
                negative from the end, none twice. Default: every row.
            renormalize: Divide each row of the weights by its sum instead of having rows that do not sum to 1
                refused (for weights rounded, cropped or averaged before sending).
            top_k: Answer only the ``k`` largest entries of each row and their key indices (``top_keys``,
                ``top_values``) instead of the whole rows: ``k`` numbers a row instead of ``L``.
            precision: ``"float32"`` or ``"float64"``: the answer's dtype (the products run in float64).
            request_id: Sent as ``X-Request-ID``.
            timeout: Seconds for each attempt of this call; default the client's.

        Returns:
            ``rollout``: ``(B, L, L)``, or ``(B, R, L)`` with ``rows``; with ``top_k``, ``top_keys`` and
            ``top_values`` ``(B, R, k)`` (largest first, ties to the lower key index) and ``rollout`` None.

        Raises:
            ValidationError: Bad input (before sending: weights not of rank 5 or not square in their last two
                axes, gradients of another shape, rows not a non-empty list of integers) or a 400/422 answer (a
                negative or non-finite weight, a row that does not sum to 1, rows out of range: the message names
                the layer, batch entry, head and row).
            ServiceError: Any other failure (a stack over the service's limits is a
                :class:`~attention_client.PayloadTooLargeError`, which says to send ``rows`` or ``top_k`` when the
                whole answer is what is too large).

        """
        body = _requests.rollout_body(
            weights,
            gradients=gradients,
            head_fusion=head_fusion,
            residual=residual,
            discard_ratio=discard_ratio,
            rows=rows,
            renormalize=renormalize,
            precision=precision,
            top_k=top_k,
        )
        return await self._post(_requests.ROLLOUT_PATH, body, RolloutResult.parse, request_id, timeout)
