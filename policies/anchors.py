"""Anchors: text matching configured patterns that must stay visible after compaction."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from policies.counting import Counter
from policies.message import Message, visible_text
from policies.plan import ANCHOR_HEADING, Plan, render

if TYPE_CHECKING:
    from policies.context import Context


def find_anchors(patterns: Sequence[re.Pattern[str]], text: str) -> tuple[str, ...]:
    """The distinct non-empty matches of `patterns` in `text`, in order of appearance."""
    found = sorted(
        (match.start(), match.group(0))
        for pattern in patterns
        for match in pattern.finditer(text)
        if match.group(0)
    )
    return tuple(dict.fromkeys(anchor for _, anchor in found))


def lost_anchors(messages: Sequence[Message], plan: Plan, ctx: Context) -> list[str]:
    """Anchors of the messages `plan` evicts or edits that its view does not show."""
    if not ctx.anchors:
        return []
    end = len(ctx.chain)
    changed = [*range(min(plan.cut, end)), *sorted(p for p in plan.edits if plan.cut <= p < end)]
    needed = dict.fromkeys(anchor for p in changed for anchor in ctx.anchor_matches(p))
    if not needed:
        return []
    view = "\n".join(visible_text(m) for m in render(messages, plan, summary_role=ctx.summary_role))
    return [anchor for anchor in needed if anchor not in view]


def anchor_block(anchors: Sequence[str], max_tokens: int, counter: Counter) -> str | None:
    """The newest anchors that fit in `max_tokens` with the heading, in order, one a line."""
    budget = max_tokens - counter.text(ANCHOR_HEADING) - 1
    kept = []
    for anchor in reversed(anchors):
        cost = counter.text(anchor) + 1
        if cost <= budget:
            kept.append(anchor)
            budget -= cost
    return "\n".join(reversed(kept)) if kept else None
