"""Anchors: text matching configured patterns that must stay visible after compaction."""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence

from policies.counting import Counter
from policies.plan import ANCHOR_HEADING


@functools.lru_cache(maxsize=256)
def anchor_pattern(pattern: str) -> re.Pattern[str]:
    """The compiled anchor pattern; ValueError when it is not a regular expression."""
    try:
        return re.compile(pattern)
    except re.error as error:
        raise ValueError(f"anchor {pattern!r} is not a valid regular expression: {error}") from None


def find_anchors(patterns: Sequence[re.Pattern[str]], text: str) -> tuple[str, ...]:
    """The distinct non-empty matches of `patterns` in `text`, in order of appearance."""
    found = sorted(
        (match.start(), match.group(0))
        for pattern in patterns
        for match in pattern.finditer(text)
        if match.group(0)
    )
    return tuple(dict.fromkeys(anchor for _, anchor in found))


def anchor_block(anchors: Sequence[str], max_tokens: int, counter: Counter) -> str | None:
    """The newest anchors that fit in `max_tokens` with the heading, in order, one a line; one
    that a newer line kept shows already (an order number in its salient line) is not
    repeated."""
    budget = max_tokens - counter.text(ANCHOR_HEADING) - 1
    kept: list[str] = []
    for anchor in reversed(anchors):
        if any(anchor in line for line in kept):
            continue
        cost = counter.text(anchor) + 1
        if cost <= budget:
            kept.append(anchor)
            budget -= cost
    return "\n".join(reversed(kept)) if kept else None
