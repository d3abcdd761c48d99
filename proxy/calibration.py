"""Calibration: how many tokens the upstream counts for each token the proxy counts.

Learnt per session from the `usage` the upstream reports for what was forwarded, and kept
with the session's state so another replica starts from it.
"""

from __future__ import annotations

import dataclasses

import policies

MIN_RATIO, MAX_RATIO = 0.5, 2.0
MAX_SESSIONS = 100_000


class Calibration:
    """Per-session ratios, bounded in number (oldest out)."""

    def __init__(self) -> None:
        self._ratios: dict[str, float] = {}

    def ratio(self, key: str) -> float | None:
        return self._ratios.get(key)

    def observe(self, key: str, upstream_tokens: int, counted_tokens: int) -> None:
        """The upstream counted `upstream_tokens` for what the proxy counted as
        `counted_tokens`: move the session's ratio halfway towards it."""
        if upstream_tokens <= 0 or counted_tokens <= 0:
            return
        ratio = min(MAX_RATIO, max(MIN_RATIO, upstream_tokens / counted_tokens))
        old = self._ratios.get(key)
        if old is None and len(self._ratios) >= MAX_SESSIONS:
            self._ratios.pop(next(iter(self._ratios)))
        self._ratios[key] = ratio if old is None else 0.5 * old + 0.5 * ratio


def in_counted_tokens(budget: policies.Budget, ratio: float) -> policies.Budget:
    """The budget in the counter's tokens when the upstream counts `ratio` times as many:
    every level, the target too, then holds in the upstream's own tokens."""
    if ratio == 1.0:
        return budget
    return dataclasses.replace(
        budget,
        limit=int(budget.limit / ratio),
        prepare_tokens=int(budget.prepare_tokens / ratio),
        compact_tokens=int(budget.compact_tokens / ratio),
        target_tokens=int(budget.target_tokens / ratio),
    )
