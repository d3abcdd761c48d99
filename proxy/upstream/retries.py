"""When an upstream request is tried again, and how long the proxy waits first.

Only before any byte has gone to the client (the request path relays nothing until
`UpstreamClient.open` has returned), and only where trying again cannot run a request twice
or waste it: a connection that could not be made (but not for a certificate that failed
verification, nor an egress proxy's refusal for its credentials or its policy: they fail
again), a pooled connection the upstream had just closed, and answers that say "not now"
(429, 503, Anthropic's 529) but not a spent quota.
Never 502 or 504: the upstream may already have run, and billed, the request. Waits are short
and bounded by the first-byte deadline, because clients retry too and the two multiply.
"""

from __future__ import annotations

import email.utils
import random
import time
from collections.abc import Iterable

import orjson

# 429 rate limited, 503 unavailable, 529 Anthropic's "overloaded".
RETRY_STATUSES = frozenset({429, 503, 529})
FIRST_BACKOFF_SECONDS = 0.25  # doubled after each retry, with jitter
MAX_BACKOFF_SECONDS = 2.0
# An upstream that asks for a longer wait gets its answer relayed at once: the client decides.
MAX_RETRY_AFTER_SECONDS = 5.0


class Retries:
    """The retry budget of one upstream request: `retries` further attempts, each wait
    ending before `deadline` (a `time.monotonic()` value)."""

    def __init__(self, retries: int, deadline: float) -> None:
        self.left = retries
        self.done = 0
        self.deadline = deadline

    def wait(self, asked: float | None = None) -> float | None:
        """Seconds to wait before the next attempt, which it counts; None when there is none
        (no attempt left, a Retry-After over the cap, or a wait that ends past the deadline).

        `asked` is the upstream's own Retry-After, honoured when it is longer than the backoff.
        """
        if self.left <= 0 or (asked is not None and asked > MAX_RETRY_AFTER_SECONDS):
            return None
        backoff = min(MAX_BACKOFF_SECONDS, FIRST_BACKOFF_SECONDS * 2.0**self.done)
        wait = backoff * random.uniform(0.5, 1.0)  # jitter: retries of a burst spread out
        if asked is not None:
            wait = max(wait, asked)
        if time.monotonic() + wait >= self.deadline:
            return None
        self.left -= 1
        self.done += 1
        return wait


def retry_after(headers: Iterable[tuple[str, str]]) -> float | None:
    """The wait an answer asks for: `retry-after-ms` (OpenAI's), else `Retry-After` in
    seconds or as an HTTP date; None when it asks for none or says it unreadably."""
    found = {name.lower(): value.strip() for name, value in headers}
    millis = found.get("retry-after-ms")
    if millis is not None:
        try:
            return max(0.0, float(millis) / 1000)
        except ValueError:
            pass
    value = found.get("retry-after")
    if value is None:
        return None
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def is_quota_error(body: bytes) -> bool:
    """OpenAI's `insufficient_quota` (a 429 that no wait will cure)."""
    try:
        error = orjson.loads(body).get("error")
    except (orjson.JSONDecodeError, AttributeError):
        return False
    if not isinstance(error, dict):
        return False
    return "insufficient_quota" in (error.get("code"), error.get("type"))
