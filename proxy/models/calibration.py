"""Calibration: how many tokens the upstream counts for each token the proxy counts.

Learnt per session and per `Counting` (the model and the proxy's counter of it: a ratio says
how one tokenizer differs from one counter, and a session may send to several models) from
the `usage` the upstream reports for what was forwarded, and kept with the session's state,
with the counting it was learnt for, so another replica starts from it. The budget is then
scaled by it (`policies.Budget.scaled`).

The upstream's count is preferred to the proxy's guess: a ratio above the current one is
taken at once (under-counting is what overflows a window); a lower one is approached by
halving the gap in log space each turn, so a ratio learnt from one part of a conversation
(images, a block of CJK text) fades once that part is gone. A model counted exactly keeps
its ratio at 1 or above: calibration may tighten its budget (media the proxy under-counts),
never let the proxy's own exact count go over it (media it over-counts stay over-counted).
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

from proxy.memo import DEFAULT_MAX_SESSIONS, make_room

if TYPE_CHECKING:
    from proxy.models.tokens import TokenCounter

# chars/4 counts code and English a little high (ratios of about 0.8), CJK text about four
# times too low, emoji and rare scripts up to about ten times: these bounds hold them all.
MIN_RATIO, MAX_RATIO = 0.25, 16.0
# Of a model's name (the client's to choose), what a counting's name keeps: it is stored
# with every session's calibration.
MAX_MODEL_NAME = 128


@dataclasses.dataclass(frozen=True)
class Counting:
    """What a ratio is learnt for: the tokens of a model's own tokenizer over those of the
    proxy's counter for it."""

    name: str  # the counter's and the model's, as stored with the ratio: "estimate:llama-3"
    exact: bool  # the counter is the model's tokenizer

    @classmethod
    def of(cls, model: str, counter: TokenCounter) -> Counting:
        return cls(f"{counter.name}:{model[:MAX_MODEL_NAME]}", counter.mode == "exact")


class Calibration:
    """Ratios per session and counting, at most `max_sessions` of them (oldest out)."""

    def __init__(self, max_sessions: int = DEFAULT_MAX_SESSIONS) -> None:
        self.max_sessions = max_sessions
        self._ratios: dict[tuple[str, str], float] = {}

    def ratio(self, key: str, counting: Counting) -> float | None:
        """The ratio this process learnt for the session's `counting`, if any."""
        return self._ratios.get((key, counting.name))

    def effective(self, key: str, counting: Counting, stored: float | None) -> float:
        """The ratio to count this session's next request by `counting` with: learnt here,
        else `stored` with the session for that counting, else 1; never under 1 for a model
        counted exactly."""
        ratio = self.ratio(key, counting) or stored or 1.0
        return bounded(ratio, exact=counting.exact)

    def observe(
        self, key: str, counting: Counting, upstream_tokens: int, counted_tokens: int
    ) -> None:
        """The upstream counted `upstream_tokens` for what the proxy counted by `counting` as
        `counted_tokens`: learn the session's ratio for that counting from it."""
        if upstream_tokens <= 0 or counted_tokens <= 0:
            return
        observed = bounded(upstream_tokens / counted_tokens, exact=counting.exact)
        entry = (key, counting.name)
        old = self._ratios.get(entry)
        make_room(self._ratios, entry, self.max_sessions)
        if old is not None and observed < old:
            observed = math.sqrt(old * observed)
        self._ratios[entry] = observed


def bounded(ratio: float, *, exact: bool) -> float:
    return min(MAX_RATIO, max(1.0 if exact else MIN_RATIO, ratio))
