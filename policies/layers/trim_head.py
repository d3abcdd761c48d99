"""trim_head: the emergency layer; the oldest messages go until the view fits.

Messages are dropped oldest first, a tool block always whole, the protected part included;
the system messages, the current turn and the header stay. When the view is still over, the
summary is shortened and then the anchor block capped: to the target when the system
messages and the current turn fit in it, else to the limit.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from policies.context import Context
from policies.draft import Draft
from policies.summary import Summary

SHORTENED = "[summary shortened to fit the context window]"


@dataclass(frozen=True)
class TrimHeadParams:
    min_summary_tokens: int = 32  # a summary that would be shorter is dropped instead

    def __post_init__(self) -> None:
        if self.min_summary_tokens < 0:
            raise ValueError("min_summary_tokens must not be negative")


async def trim_head(draft: Draft, params: TrimHeadParams) -> str:
    ctx = draft.ctx
    for unit in _units(draft):
        if not draft.over(ctx.target_tokens):  # never drops messages for a lower aim
            break
        for position, _ in draft.candidates(unit):
            draft.set(position, None)
    notes = [f"{len(draft.changed)} messages dropped"]
    goal = ctx.target_tokens if ctx.floor_tokens <= ctx.target_tokens else ctx.limit_tokens
    if draft.changed:
        draft.finish()  # the exact count: the anchors of what was dropped are in the block
    if draft.over(goal) and draft.summary is not None:
        notes.append("summary shortened")
        while draft.over(goal) and draft.summary is not None:
            draft.set_summary(_shorter(draft.summary, draft.tokens - goal, ctx, params))
            draft.finish()
    if draft.over(goal) and draft.anchor_block is not None:
        notes.append("anchor block capped")
        draft.cap_anchors(ctx.counter.text(draft.anchor_block) - (draft.tokens - goal))
        draft.finish()
        if draft.over(goal):
            draft.cap_anchors(0)
    return ", ".join(notes)


def _units(draft: Draft) -> list[range]:
    """The kept chain in droppable units, oldest first: a tool block or a single message."""
    blocks = {block.start: block for block in draft.ctx.blocks}
    units = []
    position = draft.cut
    while position < len(draft.ctx.chain):
        units.append(blocks.get(position, range(position, position + 1)))
        position = units[-1].stop
    return units


def _shorter(summary: Summary, excess: int, ctx: Context, params: TrimHeadParams) -> Summary | None:
    """The summary shortened by `excess` tokens, its tail (a digest after an LLM summary)
    first; None when too little would be left."""
    if summary.tail is not None:
        return replace(summary, tail=_cut(summary.tail, excess, ctx, params))
    text = _cut(summary.text, excess, ctx, params)
    return None if text is None else replace(summary, text=text)


def _cut(text: str, excess: int, ctx: Context, params: TrimHeadParams) -> str | None:
    """`text` shortened by `excess` tokens and marked, or None when too little would be left."""
    whole = text.removesuffix(f"\n{SHORTENED}")
    keep = ctx.counter.text(whole) - excess - ctx.counter.text(SHORTENED) - 1
    if keep < params.min_summary_tokens:
        return None
    shorter = f"{ctx.counter.head(whole, keep)}\n{SHORTENED}"
    if ctx.counter.text(shorter) >= ctx.counter.text(text):
        return None  # no progress: a tokenizer that merges across the cut
    return shorter
