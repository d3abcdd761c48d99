"""The token budget of one request: the usable part of the window and its levels.

`Policy.budget` makes it; `status` is the one place that decides what a request's size calls
for.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

Status = Literal["ok", "prepare", "compact"]

# Below this target a compacted conversation holds little more than its current turn: a request
# whose own max_tokens leaves less is not compacted (nor is its plan kept for later turns).
MIN_TARGET_TOKENS = 256


@dataclass(frozen=True)
class Budget:
    """What a request may spend on its prompt; the levels are fractions of `limit`."""

    window: int
    reserved_output: int
    safety_margin: int
    limit: int
    prepare_tokens: int
    compact_tokens: int
    target_tokens: int

    @property
    def usable(self) -> bool:
        """Whether there is room to compact into. Not when the reserved output (a max_tokens
        nearly as large as the window, say) leaves next to no target: compacting would strip
        the conversation to nothing, so such a request goes upstream unchanged. Judged in the
        window's own tokens, so a calibrated (`scaled`) budget is as usable as its original."""
        room = self.window - self.reserved_output - self.safety_margin
        if self.limit <= 0 or room <= 0:
            return False
        return room * self.target_tokens / self.limit >= MIN_TARGET_TOKENS

    def status(self, tokens: int) -> Status:
        """`compact` at or over the compact level, `prepare` at or over the prepare level;
        always `ok` for a budget that is not usable."""
        if not self.usable:
            return "ok"
        if tokens >= self.compact_tokens:
            return "compact"
        if tokens >= self.prepare_tokens:
            return "prepare"
        return "ok"

    def scaled(self, ratio: float) -> Budget:
        """This budget for a counter whose count the upstream's is `ratio` times: every
        level, the target too, in that counter's tokens (so that each holds in the
        upstream's own)."""
        if ratio == 1.0:
            return self
        return replace(
            self,
            limit=int(self.limit / ratio),
            prepare_tokens=int(self.prepare_tokens / ratio),
            compact_tokens=int(self.compact_tokens / ratio),
            target_tokens=int(self.target_tokens / ratio),
        )
