"""API keys: which credential a request presents, and whether it is one of the configured keys.

Both front ends read the same two places (HTTP headers, gRPC metadata): ``authorization: Bearer <key>``
or ``x-api-key: <key>``.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence


class ApiKeys:
    """Checks a presented key against every configured key in constant time.

    Keys are compared as SHA-256 digests with :func:`hmac.compare_digest`, so
    neither a key's content nor its length shows in the timing, and every
    configured key is compared (no early exit on the first match).
    """

    def __init__(self, keys: Sequence[str]) -> None:
        self._digests = [hashlib.sha256(key.encode()).digest() for key in keys]

    def accepts(self, presented: str) -> bool:
        digest = hashlib.sha256(presented.encode()).digest()
        matched = False
        for known in self._digests:
            matched |= hmac.compare_digest(digest, known)
        return matched


def presented_key(authorization: str | None, api_key: str | None) -> str | None:
    """The key a request presents: the credentials of ``Authorization: Bearer <key>`` (an empty string for
    another scheme, which no key matches), else ``X-API-Key``; None when it presents none.
    """
    if authorization is not None:
        scheme, _, credentials = authorization.strip().partition(" ")
        return credentials.strip() if scheme.lower() == "bearer" else ""
    key = api_key.strip() if api_key is not None else ""
    return key or None


def caller_of(keys: ApiKeys | None, presented: str | None) -> str:
    """Who a request is, for what it owns (its attention sessions): the presented key's fingerprint (the first 16
    hex digits of its SHA-256) where keys are configured, else "" (every caller is one). The key itself is never
    kept.
    """
    if keys is None or presented is None:
        return ""
    return hashlib.sha256(presented.encode()).hexdigest()[:16]


MISSING_KEY = "this endpoint needs an API key: send 'Authorization: Bearer <key>' or 'X-API-Key: <key>'"
WRONG_KEY = "the API key is not valid"
