"""The summary that stands for a whole history when the proxy serves a provider compaction
(policy `provider_compaction: serve`): the policy's summarizer's, the pre_compact hook asked
first; the mechanical digest when it fails, so that the answer is never lost to a failing
summarizer. post_compact is told the outcome. No session state is read or written: a
provider compaction keeps none."""

from __future__ import annotations

import dataclasses
import logging

import policies
from policies import Summary, SummaryRequest
from proxy.compaction.histories import Counts
from proxy.compaction.hooks import Hooks
from proxy.compaction.summarizer import Summarizers
from proxy.compaction.turn import ClientRequest, Turn
from proxy.errors import SummaryFailed
from proxy.models.limits import ModelLimits
from proxy.sessions.sessions import Loaded
from proxy.sessions.state import SessionState

log = logging.getLogger("compaction_proxy")

MIN_SUMMARY_TOKENS = 256  # a summary cap below this says too little to go on from


@dataclasses.dataclass(frozen=True)
class ProviderSummary:
    """A history's summary, with the proxy's own token counts (no upstream counted them)."""

    summary: Summary
    tokens_before: int  # the history's
    tokens_after: int  # the summary's, which stands for the history from now on


class ProviderSummaries:
    def __init__(self, summarizers: Summarizers, hooks: Hooks, limits: ModelLimits) -> None:
        self.summarizers = summarizers
        self.hooks = hooks
        self.limits = limits

    async def summarize(self, request: ClientRequest) -> ProviderSummary:
        """The summary of `request`'s whole history."""
        turn = self._turn(request)
        counter = turn.limits.counter
        messages = request.messages
        cap = _summary_cap(request.policy.compaction, turn.budget, turn.tokens_before)
        summarizer = self.summarizers.for_request(request)
        try:
            if summarizer is None:
                raise SummaryFailed("the credential may pay for no summary")
            hooked = self.hooks.summarizer(turn, summarizer, ahead=False)
            asked = SummaryRequest(None, messages, cap, None, end=len(turn.chain.digests))
            summary = Summary(await hooked(asked), "llm")
        except SummaryFailed as failed:
            log.warning(
                "provider compaction summary failed: the mechanical digest stands in",
                extra={"api": request.dialect.name, "reason": str(failed)},
            )
            text = policies.digest(None, messages, max_tokens=cap, counter=counter)
            summary = Summary(text, "digest")
        tokens_after = counter.text(summary.shown)
        self.hooks.summarized(turn, summary, tokens_after=tokens_after)
        return ProviderSummary(summary, turn.tokens_before, tokens_after)

    def _turn(self, request: ClientRequest) -> Turn:
        """The request as the hooks see a compaction's: its history alone, no session state."""
        limits = self.limits.limits(request.parsed.model, request.upstream)
        counter = limits.counter
        budget = request.policy.compaction.budget(limits.window, limits.max_output, None)
        counts = Counts(counter.message(m) for m in request.messages)
        chain = policies.Chain.of(request.messages)
        loaded = Loaded(SessionState(), 0, "ok")  # no session read: the hooks read none
        return Turn(request, limits, budget, 0, counts, chain, loaded, None)


def _summary_cap(policy: policies.Policy, budget: policies.Budget, tokens: int) -> int:
    """The summary's cap as the policy's summarize layer sets it: a share of what it covers,
    and of the target."""
    params = next(
        (p for name, p in policy.layers if isinstance(p, policies.SummarizeParams)),
        policies.SummarizeParams(),
    )
    target = budget.target_tokens
    cap = min(int(params.input_share * tokens), int(params.target_share * target))
    return max(MIN_SUMMARY_TOKENS, cap)
