"""When and how long to wait before trying a request again.

The service's endpoints are pure computations, so a request that was refused for
load (503, 429) or that never got an answer (connection refused or reset) is safe
to send again. The wait honours ``Retry-After`` (seconds or an HTTP date) when the
answer has one, up to ``max_retry_after``; otherwise it is an exponential backoff
with full jitter (the AWS Architecture Blog's "Exponential Backoff and Jitter").
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

__all__ = ["NO_RETRY", "RetryPolicy", "parse_retry_after"]


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How a client retries. ``RetryPolicy(max_retries=0)`` turns retries off."""

    max_retries: int = 3
    """Retries after the first attempt (so at most ``max_retries + 1`` requests)."""
    backoff_s: float = 0.2
    """First wait without ``Retry-After``; doubles with each retry, up to ``max_backoff_s``."""
    max_backoff_s: float = 5.0
    max_retry_after_s: float = 30.0
    """Longest ``Retry-After`` honoured; an answer asking for a longer wait is raised at once."""
    statuses: frozenset[int] = field(default_factory=lambda: frozenset({429, 503}))
    retry_connection_errors: bool = True
    """Retry when no answer came (refused, reset, closed early); client-side timeouts are not retried."""

    def __post_init__(self) -> None:
        if self.max_retries < 0 or self.backoff_s < 0 or self.max_backoff_s < 0 or self.max_retry_after_s < 0:
            raise ValueError("retry counts and waits must be >= 0")

    def delay(self, retry: int, retry_after: float | None, rng: random.Random | None = None) -> float | None:
        """Seconds to wait before retry number ``retry`` (0-based), or None when it must not happen."""
        if retry >= self.max_retries:
            return None
        if retry_after is not None:
            return retry_after if retry_after <= self.max_retry_after_s else None
        cap = min(self.max_backoff_s, self.backoff_s * (2**retry))
        return (rng or random).uniform(0, cap)


NO_RETRY = RetryPolicy(max_retries=0)


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """``Retry-After`` in seconds: delta-seconds or an HTTP date (RFC 9110 section 10.2.3); None when unreadable."""
    if value is None:
        return None
    text = value.strip()
    if text.isdigit():
        return float(text)
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())
