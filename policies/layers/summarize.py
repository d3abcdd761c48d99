"""summarize: the oldest part of the chain is replaced by a rolling summary.

The cut stays outside the protected part and the current turn, never splits a tool block and
is preferably a round start; it is the first that brings the view to the target (or the last
allowed). In an agent loop it may pass the task (the last user message): the task stays
verbatim, before the summary of the rounds since. The summarizer gets the previous summary
and the newly evicted messages as the client sent them (never a compressed, cleared or
truncated form), those an earlier layer dropped too: what they held is not lost for good.
Without a summarizer, or when it fails, returns nothing or too much, the mechanical digest
takes the summary's place, marked as a digest; after an LLM summary, that summary stays as
it was and the digest of the newly evicted part follows it.
"""

from __future__ import annotations

from dataclasses import dataclass

from policies.context import Context
from policies.digest import digest
from policies.draft import Draft
from policies.message import media_as_labels, visible_text
from policies.summary import TAIL_HEADING, Summary, SummaryRequest, too_short

OVERLONG_SLACK = 1.1  # the summarizer's tokenizer may count its output lower than ours


@dataclass(frozen=True)
class SummarizeParams:
    """The summary is capped at min(the previous summary + input_share x what it newly
    covers, target_share x the target)."""

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
    request = summary_request(draft, cut, params)
    if request is None:
        return ""
    text, detail = await _llm_summary(request, ctx)
    if text is not None:
        draft.evict(cut, Summary(text, "llm"))
    else:
        draft.evict(*_digested(draft, cut, request, params))
    return detail


def _digested(
    draft: Draft, cut: int, request: SummaryRequest, params: SummarizeParams
) -> tuple[int, Summary]:
    """The cut and the digest that takes the place of a failed summary.

    Transactional: an LLM summary stays as it was, and a digest of what is evicted now
    follows it (evicted as far as both need); the next LLM summary rolls that digest in.
    """
    previous = draft.summary
    kept = previous if previous is not None and previous.kind == "llm" else None
    if kept is not None:
        cut = max(cut, choose_cut(draft, params, kept=kept))
        request = summary_request(draft, cut, params, kept=kept) or request
    rolled = kept.tail if kept is not None else previous.text if previous is not None else None
    text = digest(
        rolled,
        request.evicted,
        max_tokens=request.max_tokens,
        counter=draft.ctx.counter,
        shown=_shown(draft, cut),
    )
    if kept is not None:
        return cut, Summary(kept.text, "llm", text or None)
    return cut, Summary(text, "digest")


def _shown(draft: Draft, cut: int) -> str:
    """The text the view keeps of the chain after `cut`, whitespace normalised."""
    task = draft.task_after(cut)
    positions = [*([] if task is None else [task]), *range(cut, len(draft.ctx.chain))]
    kept = (draft.current(p) for p in positions)
    return " ".join(" ".join(visible_text(m).split()) for m in kept if m is not None)


def summary_request(
    draft: Draft, cut: int, params: SummarizeParams, *, kept: Summary | None = None
) -> SummaryRequest | None:
    """What the summarizer is asked for evicting the chain up to `cut` (None when nothing
    there is still shown). With `kept`, an LLM summary that stays as it is, the cap is that
    of a digest of its tail and the newly evicted part."""
    ctx = draft.ctx
    positions = draft.evicted(cut)
    if not positions:
        return None
    removed = sum(map(draft.tokens_at, positions))
    max_tokens = output_cap(_previous_tokens(draft, kept), removed, ctx, params)
    return SummaryRequest(
        draft.summary,
        [media_as_labels(ctx.chain[p]) for p in positions],
        max_tokens,
        ctx.instructions,
        start=draft.cut,
        end=cut,
        positions=tuple(positions),
    )


def _previous_tokens(draft: Draft, kept: Summary | None) -> int:
    """Tokens of what the new summary rolls in: the whole summary, or the tail of a kept one."""
    counter = draft.ctx.counter
    if kept is not None:
        return counter.text(kept.tail) if kept.tail else 0
    return counter.text(draft.summary.shown) if draft.summary else 0


def output_cap(previous: int, evicted: int, ctx: Context, params: SummarizeParams) -> int:
    """The most tokens a summary may take that rolls `evicted` tokens into a previous one of
    `previous` tokens: it may grow by its share of what it newly covers (compressing the
    previous summary again at every roll would lose what it held), up to its share of the
    target."""
    share = min(previous + evicted * params.input_share, ctx.target_tokens * params.target_share)
    return max(1, int(share))


def choose_cut(draft: Draft, params: SummarizeParams, *, kept: Summary | None = None) -> int:
    """The new cut: the first round start (else block boundary) at which the view, with a
    summary of the cap's size, is at the target; the last allowed one when none is (in an
    agent loop, up to the current turn, the protected rounds included). With
    `kept`, an LLM summary that stays, the summary costs that and a digest of the cap's size."""
    ctx = draft.ctx
    limit = min(ctx.protected_start, ctx.turn_start)
    if ctx.task is not None and ctx.task < limit:
        # An agent loop's protected rounds are tool rounds (no user text after the task):
        # when the aim is out of reach before them, as many as it takes are summarised
        # rather than left to trim_head to drop (the first cut at the aim comes first).
        limit = ctx.turn_start
    previous = _previous_tokens(draft, kept)
    fixed = ctx.counter.text(kept.text) + ctx.counter.text(TAIL_HEADING) + 2 if kept else 0
    rest = draft.tokens - draft.header + draft.header_cost(Summary("", "digest"))
    removed = anchors = 0
    lost: set[str] = set()
    first = last = draft.cut
    for cut in range(draft.cut + 1, limit + 1):
        if cut - 1 == ctx.task:
            continue  # kept verbatim: not a cut that removes anything
        removed += draft.tokens_at(cut - 1)
        for anchor in set(ctx.anchor_matches(cut - 1)) - lost:
            lost.add(anchor)
            anchors += ctx.counter.text(anchor) + 1
        role = ctx.chain[cut].get("role") if cut < len(ctx.chain) else None
        if role == "tool":
            continue
        last = cut
        cost = (
            fixed
            + output_cap(previous, removed, ctx, params)
            + min(anchors, ctx.anchor_block_max_tokens)
        )
        if rest - removed + cost <= ctx.aim_tokens:
            if role == "user":
                return cut
            first = first if first > draft.cut else cut
    return first if first > draft.cut else last


async def _llm_summary(request: SummaryRequest, ctx: Context) -> tuple[str | None, str]:
    """The summarizer's summary, or None and the reason a digest takes its place."""
    if ctx.summarizer is None:
        return None, "digest"
    if too_short(request, ctx.counter.message):
        return None, "digest: too short a summary to be worth a call"
    try:
        text = await ctx.summarizer(request)
    except Exception as error:  # any failure of the injected summarizer degrades
        return None, f"degraded: {type(error).__name__}"
    if not isinstance(text, str) or not text.strip():
        return None, "degraded: empty summary"
    if ctx.counter.text(text) > request.max_tokens * OVERLONG_SLACK:
        return None, "degraded: over-long summary"
    return text.strip(), "llm"
