"""What the sync and async clients share: headers, answers into results or exceptions."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import httpx

from attention_client._wire import loads
from attention_client.errors import ServiceError, TransportError, error_for_status, invalid_input, problem_from_body
from attention_client.retry import RetryPolicy, parse_retry_after

T = TypeVar("T")
Parser = Callable[[dict[str, Any], "str | None"], T]

DEFAULT_URL = "http://127.0.0.1:8000"
API_KEY_ENV = "ATTENTION_API_KEY"
"""The environment variable the clients (and ``python -m service`` subcommands) read an API key from."""

RETRYABLE_TRANSPORT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.RemoteProtocolError, httpx.ReadError)
"""No answer came, and the request can be sent again (the service's operations are pure computations)."""
UNSENT_TRANSPORT = (httpx.ConnectError, httpx.ConnectTimeout)
"""No connection was made, so the request never reached the server: the only failures a session's step (which
appends to the server's cache) may be sent again after."""


def normalize_base_url(url: str) -> str:
    """The service's address with a scheme: ``host:port`` (tritonclient's form) gets ``http://``.

    A scheme other than http or https, or an address with no host, is refused at once
    (:class:`ValidationError`), not at the first call.
    """
    text = str(url).strip()
    if "://" not in text:
        text = "http://" + text
    scheme, _, rest = text.partition("://")
    if scheme.lower() not in ("http", "https"):
        raise invalid_input("base_url", f"{url!r}: the scheme must be http or https")
    if not rest.split("/", 1)[0]:
        raise invalid_input("base_url", f"{url!r}: no host")
    return text


def base_headers(api_key: str | None, compression: bool, user_agent: str) -> dict[str, str]:
    """Headers of every request. ``Accept-Encoding: identity`` unless ``compression``: httpx asks for gzip by
    default, and compressing a large base64 answer costs the server more than the bytes it saves on a fast link.
    """
    headers = {
        "content-type": "application/json",
        "accept": "application/json",
        "accept-encoding": "gzip" if compression else "identity",
        "user-agent": user_agent,
    }
    if api_key:
        headers["authorization"] = f"Bearer {api_key}"
    return headers


def resolve_api_key(api_key: str | None) -> str | None:
    """The explicit key, else ``$ATTENTION_API_KEY`` (empty means none)."""
    return api_key if api_key is not None else (os.environ.get(API_KEY_ENV) or None)


def call_headers(headers: Mapping[str, str], request_id: str | None) -> dict[str, str]:
    out = dict(headers)
    if request_id:
        out["x-request-id"] = request_id
    return out


def result_or_error(response: Any, parse: Parser[T]) -> T:
    """The parsed result of a 2xx answer, or the :class:`ServiceError` subclass of its status."""
    request_id = response.headers.get("x-request-id")
    content: bytes = response.content
    status: int = response.status_code
    try:
        parsed = loads(content) if content else None
    except ValueError:
        parsed = None
    if status >= 400:
        raise error_from(response, parsed)
    if not isinstance(parsed, dict):
        raise ServiceError(
            status,
            problem_from_body(status, "unexpected answer", response.headers.get("content-type", ""), content, None),
            request_id=request_id,
        )
    return parse(parsed, request_id)


def error_from(response: Any, parsed: Any = None) -> ServiceError:
    """The exception for an error answer (problem+json, /v2's ``{"error"}``, or any other body)."""
    status: int = response.status_code
    content_type = response.headers.get("content-type", "")
    if parsed is None and response.content:
        try:
            parsed = loads(response.content)
        except ValueError:
            parsed = None
    reason = getattr(response, "reason_phrase", "") or ""
    problem = problem_from_body(status, reason, content_type, response.content, parsed)
    return error_for_status(
        status,
        problem,
        request_id=response.headers.get("x-request-id"),
        headers=dict(response.headers),
        retry_after=parse_retry_after(response.headers.get("retry-after")),
    )


def retry_wait(policy: RetryPolicy, retry: int, response: Any) -> float | None:
    """Seconds to wait before retrying after this answer, or None when it is final."""
    if response.status_code not in policy.statuses:
        return None
    return policy.delay(retry, parse_retry_after(response.headers.get("retry-after")))


def transport_error(exc: httpx.HTTPError, url: str) -> TransportError:
    timed_out = isinstance(exc, httpx.TimeoutException)
    what = "timed out" if timed_out else "failed"
    return TransportError(f"request to {url} {what}: {type(exc).__name__}: {exc}".rstrip(": "), timed_out=timed_out)


def check_get(response: Any) -> dict[str, Any]:
    """The JSON object of a 2xx GET answer, else the error."""
    return result_or_error(response, lambda body, _rid: body)
