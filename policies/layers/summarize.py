"""summarize: the oldest part of the chain is replaced by a rolling summary.

The cut stays outside the protected part and the current turn, never splits a tool block and
is preferably a round start; it is the first that brings the view to the target (or the
last allowed). The summarizer gets the previous summary and the newly evicted messages as
the view showed them. Without a summarizer, or when it fails, returns nothing or too much,
the mechanical digest takes the summary's place, marked as a digest.
"""

from __future__ import annotations

from dataclasses import dataclass

from policies.context import Context
from policies.digest import digest
from policies.draft import Draft
from policies.message import media_as_labels
from policies.summary import Summary, SummaryRequest

OVERLONG_SLACK = 1.1  # the summarizer's tokenizer may count its output lower than ours


@dataclass(frozen=True)
class SummarizeParams:
    """The summary is capped at min(input_share x its input, target_share x the target)."""

    input_share: float = 0.3
    target_share: float = 0.2

    def __post_init__(self) -> None:
        if not (0 < self.input_share <= 1 and 0 < self.target_share <= 1):
            raise ValueError("input_share and target_share must be in (0, 1]")


async def summarize(draft: Draft, params: SummarizeParams) -> str:
    ctx = draft.ctx
    cut = choose_cut(draft, params) if draft.over() else draft.cut
    if cut <= draft.cut:
        return ""
    positions = range(draft.cut, cut)
    kept = [(p, m) for p in positions if (m := draft.current(p)) is not None]
    summary, detail = draft.summary, "only dropped messages evicted"
    if kept:
        previous = ctx.counter.text(draft.summary.text) if draft.summary else 0
        max_tokens = output_cap(previous + sum(map(draft.tokens_at, positions)), ctx, params)
        request = SummaryRequest(
            draft.summary,
            [media_as_labels(m) for _, m in kept],
            max_tokens,
            ctx.instructions,
            start=draft.cut,
            end=cut,
            positions=tuple(p for p, _ in kept),
        )
        summary, detail = await _summary(request, ctx)
    draft.evict(cut, summary)
    return detail


def output_cap(input_tokens: int, ctx: Context, params: SummarizeParams) -> int:
    """The most tokens a summary of `input_tokens` tokens may take."""
    share = min(input_tokens * params.input_share, ctx.target_tokens * params.target_share)
    return max(1, int(share))


def choose_cut(draft: Draft, params: SummarizeParams) -> int:
    """The new cut: the first round start (else block boundary) at which the view, with a
    summary of the cap's size, is at the target; the last allowed one when none is."""
    ctx = draft.ctx
    limit = min(
        ctx.protected_start, ctx.turn_start, len(ctx.chain) if ctx.task is None else ctx.task
    )
    previous = ctx.counter.text(draft.summary.text) if draft.summary else 0
    rest = draft.tokens - draft.header + draft.header_cost(Summary("", "digest"))
    removed = anchors = 0
    lost: set[str] = set()
    first = last = draft.cut
    for cut in range(draft.cut + 1, limit + 1):
        removed += draft.tokens_at(cut - 1)
        for anchor in set(ctx.anchor_matches(cut - 1)) - lost:
            lost.add(anchor)
            anchors += ctx.counter.text(anchor) + 1
        role = ctx.chain[cut].get("role") if cut < len(ctx.chain) else None
        if role == "tool":
            continue
        last = cut
        cost = output_cap(previous + removed, ctx, params) + min(
            anchors, ctx.anchor_block_max_tokens
        )
        if rest - removed + cost <= ctx.target_tokens:
            if role == "user":
                return cut
            first = first if first > draft.cut else cut
    return first if first > draft.cut else last


async def _summary(request: SummaryRequest, ctx: Context) -> tuple[Summary, str]:
    """The summarizer's summary, or the digest with the reason it took the summary's place."""
    fallback = "digest"
    if ctx.summarizer is not None:
        try:
            text = await ctx.summarizer(request)
        except Exception as error:  # any failure of the injected summarizer degrades
            fallback = f"degraded: {type(error).__name__}"
        else:
            if not isinstance(text, str) or not text.strip():
                fallback = "degraded: empty summary"
            elif ctx.counter.text(text) > request.max_tokens * OVERLONG_SLACK:
                fallback = "degraded: over-long summary"
            else:
                return Summary(text.strip(), "llm"), "llm"
    text = digest(
        request.previous, request.evicted, max_tokens=request.max_tokens, counter=ctx.counter
    )
    return Summary(text, "digest"), fallback
