"""Compaction of one request: replay the session's plan, compact, or retry harder.

Each request: find the session's plan for this branch of the history and apply it (the view
only grows at its end between compactions, so providers' prompt caches keep hitting); compact
when the view reaches `compact_at`; start preparing the next summary when it reaches
`prepare_at`. The store is never required: when it fails, the request is compacted from itself
alone (fail open).
"""

from __future__ import annotations

import dataclasses
import logging
import time

import policies
from policies.memory import memory_candidates
from proxy.compaction.exact_count import ExactCounts
from proxy.compaction.forward import Forward, refusal, with_max_output
from proxy.compaction.histories import SessionHistories
from proxy.compaction.kept_originals import KeptOriginals
from proxy.compaction.prepared import Bounded, PreparedSummaries
from proxy.compaction.summarizer import lock_seconds
from proxy.compaction.turn import ClientRequest, Turn
from proxy.dialects import Entries, Usage
from proxy.errors import SummaryPending
from proxy.memo import MessageDigests, content_keys
from proxy.models.calibration import Calibration
from proxy.models.limits import ModelLimits
from proxy.sessions.sessions import Lock, Sessions
from proxy.sessions.state import Branch, SessionState, decision_record

log = logging.getLogger("compaction_proxy")


class Compactor:
    def __init__(
        self,
        sessions: Sessions,
        limits: ModelLimits,
        prepared: PreparedSummaries,
        calibration: Calibration,
        *,
        digests: MessageDigests | None = None,
        max_branches: int = 4,
        exact_counts: ExactCounts | None = None,
        kept: KeptOriginals | None = None,
    ) -> None:
        self.sessions = sessions
        self.limits = limits
        self.prepared = prepared
        self.calibration = calibration
        self.histories = SessionHistories(digests or MessageDigests())
        self.max_branches = max_branches
        self.exact_counts = exact_counts  # None: decisions by the estimate alone
        self.kept = kept  # None: no originals kept, no retrieval tool

    async def prepare(self, request: ClientRequest) -> Forward:
        """The request as it goes upstream: unchanged, replayed or compacted."""
        turn = await self._turn(request)
        forward = await self._prepare(turn)
        if forward.max_output is not None:
            self.prepared.metrics.max_tokens_lowered.inc()
        if self.kept is not None:
            await self.kept.keep(request, turn.originals)
        return forward

    async def _prepare(self, turn: Turn) -> Forward:
        request = turn.request
        tokens_before = turn.tokens_before
        entries = self._entries(turn)
        tokens = tokens_before if entries is None else turn.tokens(entries)
        pending = turn.loaded.state.pending
        if not turn.budget.usable or request.parsed.opaque_reason is not None:
            # max_tokens leaves no room for a prompt: compacting would strip the session to
            # nothing (an overflow may still lower max_tokens); or the conversation is held
            # upstream, out of the proxy's sight. The upstream judges the request as it is.
            forward = self._forward(turn, None, "none", tokens_before, tokens_before)
            if request.parsed.opaque_reason is None:
                return forward
            return dataclasses.replace(forward, can_retry=False)
        status = turn.budget.status(tokens)
        unchanged: Forward | None = None
        exact = self.exact_counts
        api = exact.wanted(turn, tokens) if exact and pending is None else None
        if exact and api:
            # Near the compaction level the estimate may be wrong either way: the upstream
            # counts the request as it would go (the client's own under shadow mode), and
            # the decision is made by its count's ratio to the proxy's.
            unchanged = self._unchanged(turn, entries, tokens_before, tokens)
            ratio = await exact.ratio(turn, api, unchanged.body, unchanged.tokens_sent)
            if ratio is not None:
                turn.budget = turn.request.budget(turn.limits, ratio)
                turn.ratio = ratio
                status = turn.budget.status(tokens)
        if turn.request.client_compaction and pending is None:
            return self._client_compaction(turn, entries, tokens_before, tokens) or (
                await self._compact(turn, tokens_before, None, turn.budget.limit)
            )
        if status == "compact" and pending is None and turn.held(entries, tokens):
            self.prepared.metrics.target_unreachable.labels("held").inc()
            forward = unchanged or self._unchanged(turn, entries, tokens_before, tokens)
            return dataclasses.replace(forward, unreachable=True)
        if status == "compact" or pending is not None:
            return await self._compact(turn, tokens_before, pending, None)
        if status == "prepare":
            self.prepared.start(turn, tokens)
        return unchanged or self._unchanged(turn, entries, tokens_before, tokens)

    def _client_compaction(
        self, turn: Turn, entries: Entries | None, tokens_before: int, tokens: int
    ) -> Forward | None:
        """The client's own compaction request, as it goes when it fits the window: it asks for
        a summary of its whole history, so nothing more is taken from it than the session's
        plan already takes, and no summary is prepared (the client is about to replace the
        history it would cover). None when it must be compacted: then only to the limit, with
        the digest (no summary call), the task and the client's prompt kept."""
        if tokens > turn.budget.limit:
            return None
        return self._unchanged(turn, entries, tokens_before, tokens)

    async def view(self, request: ClientRequest) -> Entries | None:
        """The session's plan applied to this request, None when it has none: what would be
        sent, for a count of it. Nothing is compacted or stored."""
        return self._entries(await self._turn(request))

    async def retry_harder(self, request: ClientRequest, previous: Forward) -> Forward:
        """The upstream said the prompt is too long: compact to half the target, once (not
        when max_tokens leaves no room to compact into: `previous` again)."""
        turn = await self._turn(request)
        if not turn.budget.usable:
            return previous
        target = max(1, min(turn.budget.target_tokens, previous.tokens_after) // 2)
        forward = await self._compact(turn, previous.tokens_before, None, target)
        if self.kept is not None:
            await self.kept.keep(request, turn.originals)
        return dataclasses.replace(forward, can_retry=False)

    def calibrate(self, request: ClientRequest, forward: Forward, upstream_tokens: int) -> None:
        """The upstream counted `upstream_tokens` for what was forwarded: learn from it."""
        counting = self.limits.limits(request.parsed.model, request.upstream).counting
        self.calibration.observe(request.key, counting, upstream_tokens, forward.tokens_sent)

    def count_cache(self, request: ClientRequest, usage: Usage) -> None:
        """What the upstream's prompt cache read and wrote for the request: kept with the
        session (written with its next write)."""
        self.sessions.cache.observe(request.key, usage)

    async def _turn(self, request: ClientRequest) -> Turn:
        limits = self.limits.limits(request.parsed.model, request.upstream)
        if request.window is not None:
            limits = dataclasses.replace(limits, window=request.window)
        loaded = await self.sessions.load(request.key)
        stored = loaded.state.ratio_for(limits.counting)
        ratio = self.calibration.effective(request.key, limits.counting, stored)
        budget = request.budget(limits, ratio)
        messages = request.messages
        keys = request.parsed.keys or content_keys(messages)
        counts, chain = self.histories.read(request.key, messages, keys, limits.counter)
        fixed = request.dialect.fixed_tokens(request.parsed, limits.counter)
        branch = loaded.state.branch(chain)
        kept = None if self.kept is None else await self.kept.load(request)
        return Turn(request, limits, budget, fixed, counts, chain, loaded, branch, ratio, kept)

    def _unchanged(
        self, turn: Turn, entries: Entries | None, tokens_before: int, tokens: int
    ) -> Forward:
        """The request as it goes without a compaction: its plan replayed, if any."""
        if entries is None:
            return self._forward(turn, None, "none", tokens, tokens)
        return self._forward(turn, entries, "replayed", tokens_before, tokens)

    def _entries(self, turn: Turn) -> Entries | None:
        """The session's plan applied to this request; None when it has none."""
        if turn.branch is None:
            return None
        role = turn.request.policy.compaction.summary_role
        return policies.render_entries(
            turn.request.messages, turn.plan, summary_role=role, outside=turn.chain.outside
        )

    def _forward(
        self,
        turn: Turn,
        entries: Entries | None,
        action: str,
        tokens_before: int,
        tokens_after: int,
        result: policies.Compaction | None = None,
    ) -> Forward:
        request = turn.request
        # A replayed plan says what it said when it was made: its anchors were cut.
        plan = result.plan if result else turn.plan if entries is not None else None
        if self.kept is None:
            body, tool = request.body(entries), False
        else:
            body, tool = self.kept.body(request, entries, turn.originals)
        forward = Forward(
            body,
            request.key,
            action,
            turn.loaded.store,
            tokens_before,
            tokens_after,
            result.decisions if result else (),
            anchors_complete=plan is None or not plan.anchors_truncated,
            # Under shadow mode an overflow is the client's request's own: relayed as it is.
            can_retry=not request.shadow,
            reserved_output=turn.budget.reserved_output,
            window_source=turn.limits.window_source,
            levels=(turn.budget.compact_tokens, turn.budget.target_tokens),
            shadow=request.shadow,
            ratio=turn.ratio,
            client_compaction=turn.request.client_compaction,
            retrieval=tool,
        )
        # A max_tokens the prompt leaves no room for is lowered before the first try.
        lowered = turn.lowered_output(tokens_after)
        return forward if lowered is None else with_max_output(request, forward, lowered) or forward

    async def _compact(
        self, turn: Turn, tokens_before: int, instructions: str | None, target: int | None
    ) -> Forward:
        request = turn.request
        llm = None if turn.request.client_compaction else self.prepared.bounded(turn)
        saved: policies.Plan | None = None  # a degraded plan, as stored
        lock = Lock(None)
        if turn.loaded.available:
            ttl = lock_seconds(request.policy)
            # Another request's compaction or summary is waited for no longer than a summary.
            wait = request.policy.summarizer.request_wait_seconds
            lock = await self.sessions.lock(request.key, ttl, wait=wait)
        fence = lock.token
        try:
            # Another request may have compacted the session meanwhile (this one waited for
            # its lock): replay that plan when it is enough, except on the reactive path.
            if fence is not None and target is None:
                replayed = await self._replayed_after_wait(turn, tokens_before)
                if replayed is not None:
                    return replayed
            if lock.busy and target is None:
                fitting = self._fitting(turn, tokens_before)
                if fitting is not None:
                    return fitting
            result = await turn.compact(
                # Still busy elsewhere (a summary being prepared): the digest, no LLM call.
                # Instructions are for a new summary: a prepared one never saw them.
                _elsewhere
                if lock.busy and instructions is None
                else self.prepared.summarizer(turn, llm, use_prepared=not instructions),
                instructions=instructions or None,
                target_tokens=target,
            )
            if not result.fits:
                if turn.limits.counter.mode == "exact" and request.shadow:
                    # The client's bytes go upstream, which judges them: the would-be refusal
                    # is reported and recorded, not made.
                    return await self._shadow_refused(turn, result, tokens_before, fence)
                if turn.limits.counter.mode == "exact":
                    raise refusal(turn, result, tokens_before)
                # An estimate (an unknown model, a guessed window) says nothing fits: forward
                # the request as it is and let the upstream judge. Nothing is stored: a plan
                # made from a wrong guess would strip every later turn of the session.
                return self._forward(turn, None, "none", tokens_before, tokens_before)
            written = False
            short = result.short
            if result.plan != turn.plan or instructions is not None or short:
                written = await self._save(turn, result, fence, short=short)
            saved = result.plan if written and result.degraded else None
        finally:
            if fence is not None:
                await self.sessions.unlock(request.key, fence)
            # A summary that came too late takes the place of the digest it left, once done.
            if llm is not None and llm.late is not None and saved is not None:
                self.prepared.settle(
                    turn, saved, llm.late, instructions=instructions, target=target
                )
            elif llm is not None:
                llm.drop()
        self._count_summary(result, llm)
        action = "degraded" if result.degraded else "compacted"
        self.prepared.hooks.compacted(
            turn, result, action=action, tokens_before=tokens_before, reactive=target is not None
        )
        entries = policies.render_entries(
            request.messages,
            result.plan,
            summary_role=request.policy.compaction.summary_role,
            outside=turn.chain.outside,
        )
        forward = self._forward(turn, entries, action, tokens_before, result.tokens_after, result)
        if not short:
            return forward
        self.prepared.metrics.target_unreachable.labels("compacted").inc()
        return dataclasses.replace(forward, unreachable=True)

    def _count_summary(self, result: policies.Compaction, llm: Bounded | None) -> None:
        """What stood for the evicted history of a compaction that summarised it."""
        detail = next((d.detail for d in result.decisions if d.layer == "summarize"), "")
        if detail == "llm":
            kind = "llm" if llm is not None and llm.calls else "prepared"
        elif detail.startswith(("degraded", "digest:")):
            kind = "digest"
            if detail.startswith("digest: too short"):  # the layer made no call (too_short)
                self.prepared.metrics.summaries.labels("too_short").inc()
        else:
            return
        self.prepared.metrics.compaction_summaries.labels(kind).inc()

    def _fitting(self, turn: Turn, tokens_before: int) -> Forward | None:
        """The request as the session's plan makes it, when it is at the compaction level but
        still within the limit: its compaction waits for the summary being made."""
        entries = self._entries(turn)
        tokens = tokens_before if entries is None else turn.tokens(entries)
        if tokens > turn.budget.limit or turn.loaded.state.pending is not None:
            return None
        action = "none" if entries is None else "replayed"
        return self._forward(turn, entries, action, tokens_before, tokens)

    async def _replayed_after_wait(self, turn: Turn, tokens_before: int) -> Forward | None:
        """The session's new plan replayed, when another request changed it meanwhile and it
        brings this request under the compaction level (and no manual compaction waits)."""
        loaded = await self.sessions.load(turn.request.key)
        if not loaded.available or loaded.version == turn.loaded.version:
            return None
        turn.reload(loaded)
        entries = self._entries(turn)
        if entries is None or loaded.state.pending is not None:
            return None
        tokens = turn.tokens(entries)
        if turn.budget.status(tokens) == "compact":
            return None
        return self._forward(turn, entries, "replayed", tokens_before, tokens)

    async def _shadow_refused(
        self, turn: Turn, result: policies.Compaction, tokens_before: int, fence: int | None
    ) -> Forward:
        """A shadow request that would have been refused (even compacted it does not fit): the
        refusal is kept among the session's decisions, and the client's request forwarded."""
        refusal = policies.Decision(
            "refuse", (), tokens_before, result.floor_tokens, detail="context_length_exceeded"
        )
        records = [decision_record(d, shadow=True) for d in (*result.decisions, refusal)]
        await self.sessions.update(
            turn.request.key,
            lambda state: state.with_decisions(records),
            fence=fence,
            loaded=turn.loaded,
        )
        forward = self._forward(turn, None, "refused", tokens_before, tokens_before)
        return dataclasses.replace(forward, decisions=(*result.decisions, refusal))

    async def _save(
        self, turn: Turn, result: policies.Compaction, fence: int | None, *, short: bool
    ) -> bool:
        """Store the compaction's plan for its branch (`short`: it left the view at the
        compact level); whether it was written."""
        request = turn.request
        old, new = turn.plan, result.plan
        chain = [m for m in request.messages if not policies.outside_chain(m)]
        evicted = [chain[p] for p in range(old.cut, new.cut) if p != new.task] + [
            chain[p] for p, edit in new.edits.items() if edit is None and p not in old.edits
        ]
        floor = max(1, result.floor_tokens) if short else 0
        branch = Branch(new, turn.chain.prefix(new.covered), time.time(), floor)
        counting = turn.limits.counting
        calibration = self.calibration.ratio(request.key, counting)
        decisions = [decision_record(d, shadow=request.shadow) for d in result.decisions]
        candidates = memory_candidates(evicted)

        def apply(state: SessionState) -> SessionState:
            state = state.with_branch(branch, turn.chain, self.max_branches)
            state = state.with_decisions(decisions)
            state = state.with_memory(candidates).with_calibration(calibration, counting)
            return dataclasses.replace(
                state, pending=None, prepared=None if new.cut != old.cut else state.prepared
            )

        return await self.sessions.update(request.key, apply, fence=fence, loaded=turn.loaded)


async def _elsewhere(request: policies.SummaryRequest) -> str:
    raise SummaryPending("the session's summary is being made by another request")
