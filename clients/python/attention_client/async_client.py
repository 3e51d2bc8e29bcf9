"""The asynchronous client (``asyncio``; one instance may serve many concurrent calls).

This file is the one the clients are written in: ``client.py`` (the synchronous client) is generated from
it by ``clients/python/scripts/unasync.py`` (``async def`` becomes ``def``, ``await`` goes, ``httpx.AsyncClient``
becomes ``httpx.Client``, ...). Edit this file, then run the script; a test checks that the two agree. This module
holds the transport (connections, retries, errors), the session factory and the probes; the operations are mixins
written beside it and generated the same way: ``attention`` and ``attention_backward`` in ``async_attention.py``,
``softmax``, ``sample`` and ``calibrate`` in ``async_logits.py``, ``analyze`` and ``rollout`` in ``async_analysis.py``.
"""

from __future__ import annotations

import asyncio
from typing import Any, Self, TypeVar

import httpx

from attention_client import async_analysis, async_attention, async_logits
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
from attention_client.errors import TransportError
from attention_client.retry import NO_RETRY, RetryPolicy
from attention_client.types import (
    EngineName,
    Normalizer,
    Precision,
)

T = TypeVar("T")

__all__ = ["AsyncAttentionClient"]


class AsyncAttentionClient(
    async_attention.AsyncAttentionMixin,
    async_logits.AsyncLogitsMixin,
    async_analysis.AsyncAnalysisMixin,
):
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
