"""truncate_tool_fields: long tool-call arguments and tool results keep only their beginning.

A field over its threshold keeps its first `keep_tokens` tokens, then a newline and
the marker, e.g. `[TRUNCATED original~812 tokens]`. The oldest go first, until the view is at
the target; the current turn is never touched, nor is a compressed tool output (cutting its
tail would cut the errors compression kept).

A truncated argument is no longer valid JSON. The model sees the old call cut off and
marked, which tells it what was called and how the arguments began, for example

    {"path": "app.py", "content": "import os\\ndef main():\\n    ...
    [TRUNCATED original~812 tokens]

Only calls older than the current turn are truncated: they were executed long ago and no
client executes a call from the history again, so only what the model reads changes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from policies.counting import Counter
from policies.draft import Draft
from policies.message import call_arguments, call_function, content_text, tool_calls


@dataclass(frozen=True)
class TruncateToolFieldsParams:
    arguments_max_tokens: int = 500
    result_max_tokens: int = 600
    keep_tokens: int = 200
    marker: str = "[TRUNCATED original~{tokens} tokens]"

    def __post_init__(self) -> None:
        if min(self.arguments_max_tokens, self.result_max_tokens, self.keep_tokens) < 0:
            raise ValueError("token thresholds must not be negative")
        if self.keep_tokens >= min(self.arguments_max_tokens, self.result_max_tokens):
            raise ValueError("keep_tokens must be below both thresholds")


async def truncate_tool_fields(draft: Draft, params: TruncateToolFieldsParams) -> str:
    ctx = draft.ctx
    counts = {"arguments": 0, "results": 0}
    smallest = min(params.arguments_max_tokens, params.result_max_tokens)
    for position, message in draft.candidates(range(draft.cut, len(ctx.chain))):
        if not draft.over():
            break
        if draft.tokens_at(position) <= smallest or position in draft.levels:
            continue  # no field of it can be over (counting a field is the costly part)
        edit = message
        if message.get("role") == "tool":
            text = content_text(message.get("content"))
            short = _truncated(text, params.result_max_tokens, params, ctx.counter)
            if short is not None:
                edit = {**message, "content": short}
                counts["results"] += 1
        elif calls := tool_calls(message):
            new_calls = [_call(call, params, ctx.counter) for call in calls]
            truncated = sum(new is not old for new, old in zip(new_calls, calls, strict=True))
            if truncated:
                edit, counts["arguments"] = (
                    {**message, "tool_calls": new_calls},
                    counts["arguments"] + truncated,
                )
        if edit is not message:
            draft.set(position, edit)
    return f"{counts['arguments']} arguments, {counts['results']} results"


def _call(
    call: dict[str, Any], params: TruncateToolFieldsParams, counter: Counter
) -> dict[str, Any]:
    short = _truncated(call_arguments(call), params.arguments_max_tokens, params, counter)
    if short is None:
        return call
    return {**call, "function": {**call_function(call), "arguments": short}}


def _truncated(
    text: str, limit: int, params: TruncateToolFieldsParams, counter: Counter
) -> str | None:
    """The head of `text` and the marker, or None when `text` is within `limit`."""
    tokens = counter.text(text)
    if tokens <= limit:
        return None
    marker = params.marker.replace("{tokens}", str(tokens))
    return f"{counter.head(text, params.keep_tokens)}\n{marker}"
