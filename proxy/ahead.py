"""Summaries prepared ahead of time, so that a compaction needs no LLM call on its request.

When a session reaches `prepare_at`, a background task summarises the part that the next
compaction will most likely evict, single-flight across replicas (the session's lock), and
stores it with the chain hash of the prefix it covers. At compaction it replaces the LLM call
whenever that prefix still starts the conversation; what lies past its end is rolled in as a
digest.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging

import policies

from .sessions import Sessions
from .state import Prepared
from .summarizer import SummarizerFactory, lock_seconds, text_hash
from .turn import Turn

log = logging.getLogger("compaction_proxy")


class PreparedSummaries:
    def __init__(self, sessions: Sessions, summarizers: SummarizerFactory) -> None:
        self.sessions = sessions
        self.summarizers = summarizers
        self._background: set[asyncio.Task[None]] = set()

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
        # Kept referenced until done, cancelled at shutdown.
        task = asyncio.create_task(self._prepare(turn, tokens), name=key)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def wait(self) -> None:
        """Until the summaries being prepared now are done (an offline replay waits for them
        as a client waits for its answer)."""
        await asyncio.gather(*self._background, return_exceptions=True)

    def summarizer(self, turn: Turn, *, use_prepared: bool) -> policies.Summarizer | None:
        """The request's summarizer, answering from the prepared summary where it applies."""
        llm = self.summarizers.for_request(turn.request)
        prepared = turn.loaded.state.prepared
        if llm is None or prepared is None or not use_prepared:
            return llm
        return functools.partial(_with_prepared, llm, prepared, turn.chain, turn.limits.counter)

    async def _prepare(self, turn: Turn, tokens: int) -> None:
        request = turn.request
        llm = self.summarizer(turn, use_prepared=False)
        if llm is None:
            return  # nothing to prepare: the digest is made on the request path
        ttl = lock_seconds(request.policy)
        fence = await self.sessions.lock(request.key, ttl, wait=False)
        if fence is None:
            return
        try:
            made: list[tuple[policies.SummaryRequest, str]] = []

            async def recording(summary_request: policies.SummaryRequest) -> str:
                text = await llm(summary_request)
                made.append((summary_request, text))
                return text

            # Evict as if the conversation had already grown to the compaction level.
            ahead = turn.budget.compact_tokens - tokens
            await turn.compact(recording, target_tokens=max(1, turn.budget.target_tokens - ahead))
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


def _prepared_for(prepared: Prepared | None, turn: Turn) -> bool:
    """Whether a prepared summary already starts at this branch's cut and still applies."""
    plan = turn.plan
    return (
        prepared is not None
        and prepared.start == plan.cut
        and prepared.base == text_hash(plan.summary)
        and turn.chain.prefix(prepared.end) == prepared.chain
    )


async def _with_prepared(
    llm: policies.Summarizer,
    prepared: Prepared,
    chain: policies.Chain,
    counter: policies.Counter,
    request: policies.SummaryRequest,
) -> str:
    """Use the summary made ahead of time when it covers the start of what is evicted now:
    no LLM call on the request path; what lies past its end is rolled in as a digest."""
    usable = (
        request.start == prepared.start
        and prepared.end <= request.end
        and chain.prefix(prepared.end) == prepared.chain
        and text_hash(request.previous) == prepared.base
    )
    if not usable:
        return await llm(request)
    rest = [m for m, p in zip(request.evicted, request.positions, strict=True) if p >= prepared.end]
    if not rest:
        return prepared.text
    room = request.max_tokens - counter.text(prepared.text)
    if room <= 16:
        return prepared.text
    tail = policies.digest(None, rest, max_tokens=room, counter=counter)
    return f"{prepared.text}\n\n{tail}"
