"""Pure retry policy: what an HTTP result means, and when to try again.

Outcomes of one attempt:

- 2xx: delivered.
- 410 Gone: the receiver says the endpoint is gone for good (Standard Webhooks): disable it.
- timeouts, connection errors (refused, reset, DNS), 5xx, 408 and 429: transient, retry.
- any other 4xx (400 bad request, 401/403 wrong credentials, 404, 413 ...): the receiver rejected
  this request as such; sending the same bytes again cannot succeed, so the row fails at once and
  is reported instead of occupying the endpoint's queue for a day.

Retry waits use exponential backoff with *full jitter* (AWS Architecture Blog, "Exponential Backoff
And Jitter"): wait = uniform(0, min(cap, base * 2**(attempt - 1))). Full jitter spreads a burst of
alerts that failed together, so a receiver coming back is not hit by all of them at once. A
``Retry-After`` the receiver sent raises the wait (bounded by the cap).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Protocol


class Outcome(StrEnum):
    DELIVERED = "delivered"
    RETRY = "retry"
    GONE = "gone"
    REJECTED = "rejected"


RETRIED_4XX = frozenset({408, 425, 429})


def classify_status(status: int) -> Outcome:
    if 200 <= status < 300:
        return Outcome.DELIVERED
    if status == 410:
        return Outcome.GONE
    if 400 <= status < 500 and status not in RETRIED_4XX:
        return Outcome.REJECTED
    return Outcome.RETRY  # 5xx, 408/425/429, and odd codes (1xx/3xx: redirects are not followed)


class UniformSource(Protocol):
    def random(self) -> float: ...


def backoff_ceiling(attempt: int, base_s: float, cap_s: float) -> float:
    """Upper bound of the wait after the ``attempt``-th failed attempt (1-based)."""
    exponent = min(max(attempt - 1, 0), 62)  # 2**62 * base already exceeds any cap
    return min(cap_s, base_s * (2.0**exponent))


def retry_delay(
    attempt: int,
    *,
    base_s: float,
    cap_s: float,
    rng: UniformSource,
    retry_after_s: float | None = None,
) -> float:
    delay = rng.random() * backoff_ceiling(attempt, base_s, cap_s)
    if retry_after_s is not None and retry_after_s > delay:
        delay = min(retry_after_s, cap_s)
    return delay


def next_attempt_at(
    *, now: float, created_at: float, delay_s: float, give_up_after_s: float
) -> float | None:
    """When to try next, or None to give up. The last try happens at the horizon itself."""
    horizon = created_at + give_up_after_s
    if now >= horizon:
        return None
    return min(now + delay_s, horizon)
