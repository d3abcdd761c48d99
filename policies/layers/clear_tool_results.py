"""clear_tool_results: old tool results, and large old images and documents, become placeholders.

The oldest go first, until the view is at the target; the newest `keep_last` results before
the current turn and the current turn's are kept. A cleared result keeps its salient lines
(errors, failures, the records that differ) after the placeholder, up to `salient_tokens`;
those that do not fit go to the anchor block beside the summary.
"""

from __future__ import annotations

from dataclasses import dataclass

from policies.context import Context
from policies.counting import media_tokens
from policies.draft import Draft
from policies.message import Message


@dataclass(frozen=True)
class ClearToolResultsParams:
    keep_last: int = 5
    placeholder: str = "[Old tool result content cleared]"
    allow_tools: tuple[str, ...] | None = None  # None: results of every tool may be cleared
    deny_tools: tuple[str, ...] = ()
    media_max_tokens: int = 2000
    media_placeholder: str = "[Old image or document cleared]"
    salient_tokens: int = 120  # of a cleared result's salient lines kept after the placeholder

    def __post_init__(self) -> None:
        if min(self.keep_last, self.media_max_tokens, self.salient_tokens) < 0:
            raise ValueError("keep_last, media_max_tokens and salient_tokens must not be negative")


async def clear_tool_results(draft: Draft, params: ClearToolResultsParams) -> str:
    ctx = draft.ctx
    results = [p for p in range(len(ctx.chain)) if _is_tool(ctx.chain[p]) and not ctx.in_turn(p)]
    kept = set(results[len(results) - params.keep_last :] if params.keep_last else ())
    counts = {"results": 0, "media": 0}
    for position, message in draft.candidates(range(draft.cut, len(ctx.chain))):
        if not draft.over():
            break
        if _is_tool(message) and position not in kept and _clearable(message, ctx, params):
            edit, kind = {**message, "content": _placeholder(position, ctx, params)}, "results"
        else:
            edit, kind = _without_media(message, params), "media"
        if edit is not message and ctx.counter.message(edit) < draft.tokens_at(position):
            draft.set(position, edit)
            counts[kind] += 1
    return f"{counts['results']} results, {counts['media']} messages with media"


def _is_tool(message: Message) -> bool:
    return message.get("role") == "tool"


def _clearable(message: Message, ctx: Context, params: ClearToolResultsParams) -> bool:
    if message.get("content") == params.placeholder:
        return False
    return ctx.tool_selected(message, params.allow_tools, params.deny_tools)


def _placeholder(position: int, ctx: Context, params: ClearToolResultsParams) -> str:
    """The placeholder, then the result's salient lines that fit in `salient_tokens`."""
    lines = [params.placeholder]
    room = params.salient_tokens
    for line in ctx.salient_lines(position):
        room -= ctx.counter.text(line) + 1
        if room < 0:
            break
        lines.append(line)
    return "\n".join(lines)


def _without_media(message: Message, params: ClearToolResultsParams) -> Message:
    """The message with its images and documents over the size replaced by a placeholder."""
    content = message.get("content")
    if not isinstance(content, list):
        return message
    placeholder = {"type": "text", "text": params.media_placeholder}
    parts = [
        placeholder
        if isinstance(part, dict)
        and part.get("type") in ("image_url", "file")
        and media_tokens(part) > params.media_max_tokens
        else part
        for part in content
    ]
    return {**message, "content": parts} if parts != content else message
