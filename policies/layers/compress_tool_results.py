"""compress_tool_results: old tool outputs compressed by what they are, errors never cut.

Runs before anything is cleared, truncated or dropped. Every old output over `min_tokens`
goes to level 1 first (lossless: compact JSON with arrays of records as tables, a search
grouped by file, repeated lines collapsed); while the view is over the aim, every one to each
lossy level in turn (a level once begun is given to all: one break of the prefix, and the view
lands under the aim by what the level saved, so the next compaction comes later, as after
clearing whole outputs), whose budget in `levels` is its size in tokens (at four
characters a token: the compressors count characters, so that the same output at the same
level is the same bytes whatever the tokenizer). A level is always computed from the output
as the client sends it, never from an earlier compression, and the plan records each
output's level, so replayed turns are byte for byte the compaction's.

Outputs of the current turn, of excluded tools, marked as errors (`is_error`: an error as a
whole is never cut) or of a kind not in `compressors` are left as they are.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from policies.compress import KINDS, Limits, compress
from policies.context import Context
from policies.draft import Draft
from policies.message import Message, is_error_result

CHARS_PER_TOKEN = 4


@dataclass(frozen=True)
class CompressToolResultsParams:
    min_tokens: int = 250  # outputs this small are left as they are
    levels: tuple[int, ...] = (1000, 250, 60)  # each lossy level's size in tokens, after lossless
    compressors: tuple[str, ...] = KINDS
    allow_tools: tuple[str, ...] | None = None  # None: outputs of every tool
    deny_tools: tuple[str, ...] = ()  # outputs of these tools are never altered
    limits: Limits = field(default_factory=Limits)

    def __post_init__(self) -> None:
        if self.min_tokens < 0:
            raise ValueError("min_tokens must not be negative")
        if any(b <= 0 or b >= a for a, b in zip((2**63, *self.levels), self.levels, strict=False)):
            raise ValueError("levels must be positive and decreasing")
        unknown = sorted(set(self.compressors) - set(KINDS))
        if unknown:
            raise ValueError(f"unknown compressors {unknown} (known: {', '.join(KINDS)})")


async def compress_tool_results(draft: Draft, params: CompressToolResultsParams) -> str:
    ctx = draft.ctx
    outputs = [
        p
        for p in range(draft.cut, len(ctx.chain))
        if ctx.chain_tokens[p] > params.min_tokens and _compressible(p, ctx, params)
    ]
    done: dict[int, int] = {}  # the level each output was compressed to
    for level in range(1, len(params.levels) + 2):
        if not draft.over():
            return _detail(done)
        for position in outputs:
            current = draft.levels.get(position)
            if current is None and position in draft.edits:
                continue  # another layer's edit of it (cleared, truncated, dropped) stands
            if current is not None and current >= level:
                continue
            edit = compressed(ctx.chain[position], level, params)
            if edit is not None and ctx.counter.message(edit) < draft.tokens_at(position):
                draft.set(position, edit, level)
                done[position] = level
    return _detail(done)


def compressed(message: Message, level: int, params: CompressToolResultsParams) -> Message | None:
    """The tool message with its text compressed at `level` (each text part on its own, in
    proportion to its share of the text); None when nothing of it compresses."""
    budget = None if level == 1 else params.levels[level - 2] * CHARS_PER_TOKEN
    content = message.get("content")
    if isinstance(content, str):
        done = compress(content, budget, kinds=params.compressors, limits=params.limits)
        return None if done is None else {**message, "content": done.text}
    if not isinstance(content, list):
        return None
    texts = [p["text"] for p in content if isinstance(p, dict) and p.get("type") == "text"]
    total = sum(len(text) for text in texts if isinstance(text, str))
    parts = []
    for part in content:
        text = part.get("text") if isinstance(part, dict) and part.get("type") == "text" else None
        share = None
        if isinstance(text, str) and budget is not None:
            share = max(1, budget * len(text) // max(1, total))
        done = (
            None
            if not isinstance(text, str)
            else compress(text, share, kinds=params.compressors, limits=params.limits)
        )
        parts.append(part if done is None else {**part, "text": done.text})
    if all(new is old for new, old in zip(parts, content, strict=True)):
        return None
    return {**message, "content": parts}


def _compressible(position: int, ctx: Context, params: CompressToolResultsParams) -> bool:
    message = ctx.chain[position]
    if message.get("role") != "tool" or ctx.in_turn(position) or is_error_result(message):
        return False
    return ctx.tool_selected(message, params.allow_tools, params.deny_tools)


def _detail(done: dict[int, int]) -> str:
    counts = Counter(done.values())
    return ", ".join(f"{counts[level]} at level {level}" for level in sorted(counts))
