"""drop_tool_blocks: old tool blocks are removed whole, the call with all its results.

The newest `keep_last` blocks before the current turn are kept; older ones go, oldest first,
until the view is at the target. In the protected part an assistant message's own text
survives its block, as a plain assistant message.
"""

from __future__ import annotations

from dataclasses import dataclass

from policies.draft import Draft
from policies.message import Message, content_text, tool_calls


@dataclass(frozen=True)
class DropToolBlocksParams:
    keep_last: int = 5

    def __post_init__(self) -> None:
        if self.keep_last < 0:
            raise ValueError("keep_last must not be negative")


async def drop_tool_blocks(draft: Draft, params: DropToolBlocksParams) -> str:
    ctx = draft.ctx
    blocks = [b for b in ctx.blocks if not ctx.in_turn(b.start)]
    dropped = 0
    for block in blocks[: max(0, len(blocks) - params.keep_last)]:
        if not draft.over():
            break
        call = draft.current(block.start)
        if call is None or not tool_calls(call):
            continue
        for position, message in draft.candidates(block):
            draft.set(position, _text_only(message) if position >= ctx.protected_start else None)
        dropped += 1
    return f"{dropped} blocks"


def _text_only(message: Message) -> Message | None:
    """An assistant message's text without its tool calls; None for tool results or no text."""
    if message.get("role") != "assistant" or not content_text(message.get("content")).strip():
        return None
    return {key: value for key, value in message.items() if key != "tool_calls"}
