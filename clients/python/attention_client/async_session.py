"""Attention sessions from ``asyncio`` code: the server keeps a sequence's keys and values (docs/guides/sessions.md).

This file is the one the sessions are written in: ``session.py`` (the synchronous session) is generated from it by
``clients/python/scripts/unasync.py``, as ``client.py`` is from ``async_client.py``. Edit this file, then run the
script; a test checks that the two agree.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal, Self, overload

import numpy.typing as npt

from attention_client import _session_requests
from attention_client._common import call_headers, result_or_error
from attention_client._wire import dumps
from attention_client.errors import ServiceError, invalid_input
from attention_client.results import DefaultSessionStepResult, SessionStepResult
from attention_client.types import EngineName, Normalizer, Precision, SessionReturn

if TYPE_CHECKING:
    from attention_client.async_client import AsyncAttentionClient

__all__ = ["AsyncAttentionSession"]


def _positions_seen(body: dict[str, Any], _request_id: str | None) -> int:
    return int(body.get("positions_seen", 0))


class AsyncAttentionSession:
    """One sequence's attention session: ``async with client.session() as s``, then ``await s.step(q, k, v)``.

    The first step starts the sequence on the server (its keys and values are the cache's first positions); each
    later step appends its keys and values, and its query rows attend over every position the cache keeps,
    aligned ``bottom_right``: the numbers of ``client.attention(q, K, V, causal="bottom_right")`` over the kept
    ``K`` and ``V``. Leaving the ``async with`` block (or :meth:`end`) ends the session and frees its cache; a
    step after that raises :class:`~attention_client.ValidationError` before sending anything.

    Steps are answered in the order they are sent: send a step after the answer of the one before. A step is not
    sent again after a failure that may have reached the server (it would append twice); after a
    :class:`~attention_client.TransportError` start again (``start=True`` with the whole prefix).
    """

    def __init__(
        self,
        client: AsyncAttentionClient,
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
    ) -> None:
        """Made by :meth:`AsyncAttentionClient.session <attention_client.AsyncAttentionClient.session>`.

        Args:
            client: The client whose connections, retries and API key the session's requests use.
            sequence_id: As for ``session``.
            window: As for ``session``.
            sinks: As for ``session``.
            sink_positions: As for ``session``.
            scale: As for ``session``.
            temperature: As for ``session``.
            normalizer: As for ``session``.
            alpha: As for ``session``.
            engine: As for ``session``.
            precision: As for ``session``.

        """
        self._client = client
        self.sequence_id: int | str = _session_requests.session_id(sequence_id)
        """The id on the server (the one given, or the fresh one drawn)."""
        self._path = _session_requests.session_path(self.sequence_id)
        self._routing = _session_requests.routing_headers(self.sequence_id)
        self._options = _session_requests.session_options(
            scale=scale,
            temperature=temperature,
            normalizer=normalizer,
            alpha=alpha,
            engine=engine,
            precision=precision,
            window=window,
            sinks=sinks,
            sink_positions=sink_positions,
        )
        self._state: Literal["new", "live", "ended"] = "new"
        self.positions_seen = 0
        """Positions appended since the start, as the last answer said."""
        self.cache_length = 0
        """Positions the cache keeps, as the last answer said."""

    def _headers(self, request_id: str | None) -> dict[str, str]:
        return {**call_headers(self._client._headers, request_id), **self._routing}

    @property
    def live(self) -> bool:
        """A step started the session and it has not ended (as far as this client knows: the server may have
        evicted it since, after ``ATTN_SESSION_IDLE_S`` without a step).
        """
        return self._state == "live"

    def __repr__(self) -> str:
        state = {"new": "not started", "live": "live", "ended": "ended"}[self._state]
        return f"{type(self).__name__}({self.sequence_id!r}, {state}, positions_seen={self.positions_seen})"

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, exc_type: object, exc: object, traceback: object) -> None:
        if exc_type is None:
            await self.end()
            return
        with contextlib.suppress(ServiceError):  # the block's own exception is the one to see
            await self.end()

    @overload
    async def step(
        self,
        query: npt.ArrayLike,
        key: npt.ArrayLike,
        value: npt.ArrayLike,
        *,
        mask: npt.ArrayLike | None = ...,
        scale: float | None = ...,
        temperature: float | None = ...,
        normalizer: Normalizer | None = ...,
        alpha: float | None = ...,
        engine: EngineName | None = ...,
        returns: None = ...,
        start: bool | None = ...,
        end: bool = ...,
        request_id: str | None = ...,
        timeout: float | None = ...,
    ) -> DefaultSessionStepResult: ...

    @overload
    async def step(
        self,
        query: npt.ArrayLike,
        key: npt.ArrayLike,
        value: npt.ArrayLike,
        *,
        mask: npt.ArrayLike | None = ...,
        scale: float | None = ...,
        temperature: float | None = ...,
        normalizer: Normalizer | None = ...,
        alpha: float | None = ...,
        engine: EngineName | None = ...,
        returns: Sequence[SessionReturn],
        start: bool | None = ...,
        end: bool = ...,
        request_id: str | None = ...,
        timeout: float | None = ...,
    ) -> SessionStepResult: ...

    async def step(
        self,
        query: npt.ArrayLike,
        key: npt.ArrayLike,
        value: npt.ArrayLike,
        *,
        mask: npt.ArrayLike | None = None,
        scale: float | None = None,
        temperature: float | None = None,
        normalizer: Normalizer | None = None,
        alpha: float | None = None,
        engine: EngineName | None = None,
        returns: Sequence[SessionReturn] | None = None,
        start: bool | None = None,
        end: bool = False,
        request_id: str | None = None,
        timeout: float | None = None,
    ) -> SessionStepResult:
        """``POST /v1/sessions/{sequence_id}/steps``: append ``key`` and ``value`` to the cache, and answer
        ``query`` over every kept position (aligned ``bottom_right``).

        Args:
            query: ``(B, Hq, L_step, E)``, ``(Hq, L_step, E)`` or ``(L_step, E)``; ``Hq`` a multiple of the key
                heads, and may differ from step to step.
            key: ``(B, Hkv, S_step, E)``, the query's rank: the positions appended (any number). Batch, key heads
                and head size are fixed by the start.
            value: ``(B, Hkv, S_step, Ev)``; ``Ev`` fixed by the start.
            mask: Broadcastable to ``(B, Hq, L_step, cache_length)`` (``cache_length`` after the append):
                booleans (True = may attend) or an additive float mask; on top of the ``bottom_right`` alignment.
            scale: This step's, instead of the session's.
            temperature: This step's, instead of the session's.
            normalizer: This step's, instead of the session's.
            alpha: This step's, instead of the session's.
            engine: This step's, instead of the session's.
            returns: What to send back, of ``"output"``, ``"weights"``, ``"diagnostics"``. Default (None): output
                and diagnostics (and the weights while they have at most 65,536 values), as a
                :class:`~attention_client.DefaultSessionStepResult`.
            start: None (default): start the sequence with this step when the session has not started. True: start
                it again (the server drops the live cache; the answer says ``restarted``), e.g. after an eviction,
                with the whole prefix. False: append to a sequence of this id that is live on the server already.
            end: End the session after this step (its cache is freed; the answer's ``cache_length`` is 0).
            request_id: Sent as ``X-Request-ID``.
            timeout: Seconds for each attempt of this call; default the client's.

        Returns:
            The arrays asked for (others None), ``cache_length``, ``positions_seen``, ``restarted``, ``ended``,
            the diagnostics (with ``sink_mass``), the engine that ran it and the timings.

        Raises:
            ValidationError: Bad input (before sending), a step after the session ended (before sending), or a
                400/422 answer: a step the cache refuses (its detail names the field), or a sequence that is not
                live on the server (never started, ended, evicted: the detail says which).
            PayloadTooLargeError: The cache would keep more positions than the server allows (start with a window).
            ServiceError: Any other failure.

        """
        starting = self._state == "new" if start is None else bool(start)
        if self._state == "ended" and not starting:
            raise invalid_input(
                "sequence_id",
                f"session {self.sequence_id!r} has ended; start a new one (client.session), or send this step "
                "with start=True and the whole prefix",
            )

        step_options = _session_requests.session_options(
            scale=scale, temperature=temperature, normalizer=normalizer, alpha=alpha, engine=engine
        )
        options = {**self._options, **step_options}
        body = _session_requests.session_step_body(
            query, key, value, start=starting, end=end, mask=mask, options=options, returns=returns
        )
        parse = SessionStepResult.parse if returns is not None else DefaultSessionStepResult.parse
        response = await self._client._send(
            "POST", self._path + "/steps", dumps(body), self._headers(request_id), timeout, replayable=False
        )
        result = result_or_error(response, parse)
        self._state = "ended" if result.ended else "live"
        self.positions_seen, self.cache_length = result.positions_seen, result.cache_length
        return result

    async def end(self, *, request_id: str | None = None, timeout: float | None = None) -> int | None:
        """``DELETE /v1/sessions/{sequence_id}``: end the session now (after a step in flight), freeing its cache.

        A session that is not live is not an error: nothing is sent when it never started or already ended, and
        the server's 404 (it evicted the session, or another client ended it) means it is gone already.

        Args:
            request_id: Sent as ``X-Request-ID``.
            timeout: Seconds for each attempt of this call; default the client's.

        Returns:
            The ``positions_seen`` the server reports, or None when there was no live session to end.

        Raises:
            ServiceError: A failure other than the 404 (no answer, a 5xx once the retries are spent, ...).

        """
        if self._state != "live":
            self._state = "ended"
            return None
        response = await self._client._send("DELETE", self._path, None, self._headers(request_id), timeout)
        seen = None if response.status_code == 404 else result_or_error(response, _positions_seen)
        self._state, self.cache_length = "ended", 0
        if seen is not None:
            self.positions_seen = seen
        return seen
