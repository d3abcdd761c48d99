"""Calibration: how many tokens the upstream counts for each token the proxy counts.

Learnt per session from the `usage` the upstream reports for what was forwarded, and kept
with the session's state so another replica starts from it. The budget is then scaled by it
(`policies.Budget.scaled`).

The upstream's count is preferred to the proxy's guess: a ratio above the current one is
taken at once (under-counting is what overflows a window); a lower one is approached by
halving the gap in log space each turn, so a ratio learnt from one part of a conversation
(images, a block of CJK text) fades once that part is gone. A model counted exactly keeps
its ratio at 1 or above: calibration may tighten its budget (media the proxy under-counts),
never let the proxy's own exact count go over it (media it over-counts stay over-counted).
"""

from __future__ import annotations

import math

from proxy.memo import DEFAULT_MAX_SESSIONS, make_room

# chars/4 counts code and English a little high (ratios of about 0.8), CJK text about four
# times too low, emoji and rare scripts up to about ten times: these bounds hold them all.
MIN_RATIO, MAX_RATIO = 0.25, 16.0


class Calibration:
    """Per-session ratios, at most `max_sessions` (oldest out)."""

    def __init__(self, max_sessions: int = DEFAULT_MAX_SESSIONS) -> None:
        self.max_sessions = max_sessions
        self._ratios: dict[str, float] = {}

    def ratio(self, key: str) -> float | None:
        """The ratio this process learnt for the session, if any."""
        return self._ratios.get(key)

    def effective(self, key: str, stored: float | None, *, exact: bool) -> float:
        """The ratio to count this session's next request with: learnt here, else stored
        with the session, else 1; never under 1 for a model counted exactly."""
        ratio = self._ratios.get(key) or stored or 1.0
        return bounded(ratio, exact=exact)

    def observe(self, key: str, upstream_tokens: int, counted_tokens: int, *, exact: bool) -> None:
        """The upstream counted `upstream_tokens` for what the proxy counted as
        `counted_tokens`: learn the session's ratio from it."""
        if upstream_tokens <= 0 or counted_tokens <= 0:
            return
        observed = bounded(upstream_tokens / counted_tokens, exact=exact)
        old = self._ratios.get(key)
        make_room(self._ratios, key, self.max_sessions)
        if old is not None and observed < old:
            observed = math.sqrt(old * observed)
        self._ratios[key] = observed


def bounded(ratio: float, *, exact: bool) -> float:
    return min(MAX_RATIO, max(1.0 if exact else MIN_RATIO, ratio))
