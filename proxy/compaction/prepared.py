"""Summaries made off the request path: prepared ahead of time, and finished after a request
stopped waiting for them.

When a session reaches `prepare_at`, a background task summarises the part that the next
compaction will most likely evict, single-flight across replicas (the session's lock), and
stores it with the chain hash of the prefix it covers. At compaction it replaces the LLM call
whenever that prefix still starts the conversation; what lies past its end is rolled in as a
digest.

A request waits for a summary only `summarizer.request_wait_seconds` (`Bounded`): then its
compaction degrades to a digest, the summary is finished in the background (retries with
their full timeout) and, when it comes, the request is compacted again with it: that plan,
the one the compaction would have made in time, takes the degraded one's place for the
next turns.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
from collections.abc import Coroutine

import policies
from proxy.compaction.hooks import Hooks
from proxy.compaction.summarizer import SummarizerFactory, lock_seconds, text_hash
from proxy.compaction.turn import Turn
from proxy.config import Hooks as HooksSettings
from proxy.errors import SummaryPending
from proxy.observability.metrics import Metrics
from proxy.sessions.sessions import Sessions
from proxy.sessions.state import Prepared, SessionState

log = logging.getLogger("compaction_proxy")


class PreparedSummaries:
    def __init__(
        self,
        sessions: Sessions,
        summarizers: SummarizerFactory,
        metrics: Metrics,
        hooks: Hooks | None = None,
    ) -> None:
        self.sessions = sessions
        self.summarizers = summarizers
        self.metrics = metrics
        self.hooks = hooks or Hooks(HooksSettings(), metrics)  # none configured
        self._background: set[asyncio.Task[None]] = set()

    @property
    def working(self) -> bool:
        """Whether a summary is being made or settled in the background."""
        return bool(self._background)

    async def close(self) -> None:
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)

    def start(self, turn: Turn, tokens: int) -> None:
        """Summarise in the background what the next compaction will most likely evict."""
        key = turn.request.key
        if not turn.loaded.available or _prepared_for(turn.loaded.state.prepared, turn):
            return
        if any(task.get_name() == key for task in self._background):
            return
        self._spawn(self._prepare(turn, tokens), key)

    async def wait(self) -> None:
        """Until the summaries being prepared now are done (an offline replay waits for them
        as a client waits for its answer)."""
        await asyncio.gather(*self._background, return_exceptions=True)

    def bounded(self, turn: Turn) -> Bounded | None:
        """The request's summarizer, as long as the request may wait for it (None: the
        mechanical digest stands in for summaries)."""
        llm = self._llm(turn, ahead=False)
        wait = turn.request.policy.summarizer.request_wait_seconds
        return None if llm is None else Bounded(llm, wait)

    def _llm(self, turn: Turn, *, ahead: bool) -> policies.Summarizer | None:
        """The request's summarizer, asking the pre_compact hook before each summary."""
        llm = self.summarizers.for_request(turn.request)
        return None if llm is None else self.hooks.summarizer(turn, llm, ahead=ahead)

    def summarizer(
        self, turn: Turn, llm: policies.Summarizer | None, *, use_prepared: bool
    ) -> policies.Summarizer | None:
        """`llm`, answering from the prepared summary where it applies."""
        prepared = turn.loaded.state.prepared
        if llm is None or prepared is None or not use_prepared:
            return llm
        return functools.partial(_with_prepared, llm, prepared, turn.chain, turn.limits.counter)

    def settle(
        self,
        turn: Turn,
        plan: policies.Plan,
        late: Late,
        *,
        instructions: str | None,
        target: int | None,
    ) -> None:
        """When the summary the request stopped waiting for comes, compact the request again
        with it, as the compaction would have had it come in time, and put that plan in the
        place of `plan` (the degraded one, as saved) unless the session moved on meanwhile.
        In the background."""

        async def in_time(request: policies.SummaryRequest) -> str:
            if request != late.request:
                raise SummaryPending("not the summary that came late")
            return await late.task

        async def settling() -> None:
            if not await _succeeds(late.task):
                return  # the summarizer's metrics and log say why; the digest stays
            summarizer = self.summarizer(turn, in_time, use_prepared=not instructions)
            result = await turn.compact(
                summarizer, instructions=instructions or None, target_tokens=target
            )
            if not result.degraded and result.fits and await self._replace(turn, plan, result):
                reactive = target is not None
                tokens = turn.tokens_before
                self.hooks.compacted(
                    turn, result, action="settled", tokens_before=tokens, reactive=reactive
                )

        self._spawn(settling(), f"settle:{turn.request.key}")

    def _spawn(self, work: Coroutine[None, None, None], name: str) -> None:
        # Kept referenced until done, cancelled at shutdown.
        task = asyncio.create_task(work, name=name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _replace(self, turn: Turn, plan: policies.Plan, settled: policies.Compaction) -> bool:
        """`settled`'s plan in the place of `plan`, while the session's branch still holds it;
        whether it took its place."""

        def apply(state: SessionState) -> SessionState:
            branch = state.branch(turn.chain)
            if branch is None or branch.plan != plan:
                return state  # compacted again meanwhile: that plan rolled the digest in
            new = dataclasses.replace(branch, plan=settled.plan)
            branches = tuple(new if b is branch else b for b in state.branches)
            return dataclasses.replace(state, branches=branches)

        if not await self.sessions.update(turn.request.key, apply):
            return False
        self.metrics.compaction_summaries.labels("settled").inc()
        return True

    async def _prepare(self, turn: Turn, tokens: int) -> None:
        request = turn.request
        llm = self._llm(turn, ahead=True)
        if llm is None:
            return  # nothing to prepare: the digest is made on the request path
        ttl = lock_seconds(request.policy)
        fence = (await self.sessions.lock(request.key, ttl)).token
        if fence is None:
            return
        try:
            made: list[tuple[policies.SummaryRequest, str]] = []

            async def recording(summary_request: policies.SummaryRequest) -> str:
                text = await llm(summary_request)
                made.append((summary_request, text))
                return text

            # Evict as if the conversation had already grown to the compaction level.
            await turn.compact(recording, ahead_tokens=max(0, turn.budget.compact_tokens - tokens))
            if made:
                last, text = made[-1]
                prepared = Prepared(
                    start=last.start,
                    end=last.end,
                    chain=turn.chain.prefix(last.end),
                    base=text_hash(made[0][0].previous),
                    text=text,
                )
                await self.sessions.update(
                    request.key, lambda s: dataclasses.replace(s, prepared=prepared), fence=fence
                )
        except Exception as exc:  # a background failure must never surface
            log.warning("summary ahead of time failed", extra={"error": type(exc).__name__})
        finally:
            await self.sessions.unlock(request.key, fence)


@dataclasses.dataclass(frozen=True)
class Late:
    """A summary the request path stopped waiting for, still being made."""

    request: policies.SummaryRequest
    task: asyncio.Task[str]


class Bounded:
    """A summarizer that the request path waits for at most `wait` seconds: a summary not
    ready by then goes on in the background (`late`), and the request degrades."""

    def __init__(self, llm: policies.Summarizer, wait: float) -> None:
        self.llm = llm
        self.wait = wait
        self.calls = 0
        self.late: Late | None = None

    async def __call__(self, request: policies.SummaryRequest) -> str:
        self.calls += 1
        task = asyncio.ensure_future(self.llm(request))
        try:
            return await asyncio.wait_for(asyncio.shield(task), self.wait)
        except TimeoutError:
            self.drop()
            self.late = Late(request, task)
            raise SummaryPending(f"no summary within {self.wait:g} s") from None
        except asyncio.CancelledError:
            task.cancel()  # the request went away: nobody will use it
            raise

    def drop(self) -> None:
        """Stop the late summary, when there is nothing to use it for."""
        if self.late is not None:
            self.late.task.cancel()
            self.late = None


def _prepared_for(prepared: Prepared | None, turn: Turn) -> bool:
    """Whether a prepared summary already starts at this branch's cut and still applies."""
    plan = turn.plan
    return (
        prepared is not None
        and prepared.start == plan.cut
        and prepared.base == text_hash(plan.summary)
        and turn.chain.prefix(prepared.end) == prepared.chain
    )


async def _succeeds(task: asyncio.Task[str]) -> bool:
    """Whether the summary being made comes (a failure is the summarizer's to report)."""
    try:
        await task
    except Exception:
        return False
    return True


async def _with_prepared(
    llm: policies.Summarizer,
    prepared: Prepared,
    chain: policies.Chain,
    counter: policies.Counter,
    request: policies.SummaryRequest,
) -> str:
    """Use the summary made ahead of time when it covers the start of what is evicted now:
    no LLM call on the request path when what lies past its end fits beside it as a digest,
    else a call that folds that part into it (`policies.roll_prepared`)."""
    usable = (
        request.start == prepared.start
        and prepared.end <= request.end
        and chain.prefix(prepared.end) == prepared.chain
        and text_hash(request.previous) == prepared.base
    )
    if not usable:
        return await llm(request)
    rolled = policies.roll_prepared(prepared.text, prepared.start, prepared.end, request, counter)
    if isinstance(rolled, policies.SummaryRequest):
        return await llm(rolled)
    return rolled.text
