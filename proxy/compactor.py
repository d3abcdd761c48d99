"""Wiring the pure compaction pipeline (`policies/`) to a request and its session.

Each request: find the session's plan for this branch of the history, apply it (the view
only grows at its end between compactions, so providers' prompt caches keep hitting),
compact when the view reaches `compact_at`, and prepare the next summary in the background
when it reaches `prepare_at`. The store is never required: when it fails, the request is
compacted from itself alone (fail open).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import time
from collections.abc import Coroutine
from typing import Any

import orjson

import policies
from policies.memory import memory_candidates

from .config import Config, Policy, Upstream
from .errors import ContextLengthExceeded, StoreUnavailableError
from .memo import MessageDigests, content_keys
from .metrics import Metrics
from .models import ModelCatalog
from .state import Branch, Prepared, SessionState, decision_record
from .store import SessionStore, StoreUnavailable, session_key
from .summarizer import Cooldowns, LLMSummarizer, text_hash
from .tokens import TokenCounter, counter_for
from .upstream import UpstreamClient

log = logging.getLogger("compaction_proxy")

CAS_ATTEMPTS = 3
LOCK_POLL_SECONDS = 0.05


@dataclasses.dataclass(frozen=True)
class Chat:
    """One chat completion request, as the proxy understood it."""

    tenant: str
    session: str
    model: str
    body: dict[str, Any]
    raw: bytes
    policy: Policy
    upstream: Upstream
    max_output: int | None
    credential: str | None  # for the summarizer of this request only; never stored

    @functools.cached_property
    def key(self) -> str:
        return session_key(self.tenant, self.session)

    @property
    def messages(self) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = self.body["messages"]
        return messages


@dataclasses.dataclass(frozen=True)
class Forward:
    """What goes upstream, and what the proxy did to get it."""

    body: bytes
    session_hash: str
    action: str
    store: str
    tokens_before: int
    tokens_after: int
    decisions: tuple[policies.Decision, ...] = ()
    can_retry: bool = True
    anchors_complete: bool = True

    def headers(self) -> list[tuple[str, str]]:
        headers = [
            ("x-compaction-session", self.session_hash),
            ("x-compaction-action", self.action),
            ("x-compaction-store", self.store),
            ("x-compaction-tokens-before", str(self.tokens_before)),
            ("x-compaction-tokens-after", str(self.tokens_after)),
        ]
        if not self.anchors_complete:
            headers.append(("x-compaction-anchors", "truncated"))
        return headers


@dataclasses.dataclass(frozen=True)
class Limits:
    window: int
    max_output: int | None
    counter: TokenCounter


@dataclasses.dataclass
class Loaded:
    """The session's state as read, and whether the store answered."""

    state: SessionState
    version: int
    store: str


@dataclasses.dataclass
class Turn:
    """Everything one request's compaction decisions are made from."""

    chat: Chat
    limits: Limits
    budget: policies.Budget
    fixed: int
    counts: list[int]  # tokens of each message of the request
    chain: policies.Chain
    loaded: Loaded
    branch: Branch | None

    @property
    def plan(self) -> policies.Plan:
        return self.branch.plan if self.branch else policies.Plan()

    @property
    def tokens_before(self) -> int:
        return self.fixed + sum(self.counts)

    def tokens(self, view: list[dict[str, Any]]) -> int:
        """Tokens of `view`; the messages it shares with the request are not counted again."""
        known = {id(m): t for m, t in zip(self.chat.messages, self.counts, strict=True)}
        counter = self.limits.counter
        return self.fixed + sum(known.get(id(m)) or counter.message(m) for m in view)


class Compactor:
    def __init__(
        self, config: Config, store: SessionStore, client: UpstreamClient, metrics: Metrics
    ) -> None:
        self.config = config
        self.store = store
        self.client = client
        self.metrics = metrics
        self.catalog = ModelCatalog()
        self.cooldowns = Cooldowns()
        self.digests = MessageDigests()
        self._limits: dict[str, Limits] = {}
        self._calibration: dict[str, float] = {}
        self._background: set[asyncio.Task[None]] = set()
        self.warm = False

    def warm_up(self) -> None:
        """Load the current models' tokenizer and the model map before the first request
        (older encodings load on first use: each costs tens of MB)."""
        self.limits("gpt-4o").counter.text("warm up")
        self.warm = True

    async def close(self) -> None:
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)

    def limits(self, model: str) -> Limits:
        """The model's window, max output and token counter (memoised per model name)."""
        found = self._limits.get(model)
        if found is None:
            override = self.config.model(model)
            info = self.catalog.lookup(model)
            window = (override and override.context_window) or info.context_window
            max_output = (override and override.max_output_tokens) or info.max_output_tokens
            counter = counter_for(
                model,
                override.counting if override else "auto",
                override.encoding if override else None,
            )
            found = Limits(window or self.config.default_context_window, max_output, counter)
            if len(self._limits) < 10_000:
                self._limits[model] = found
        return found

    # -- the request path ---------------------------------------------------------------

    async def prepare(self, chat: Chat) -> Forward:
        turn = await self._turn(chat)
        messages = chat.messages
        tokens_before = turn.tokens_before
        view = self._view(turn)
        tokens = tokens_before if view is messages else turn.tokens(view)
        pending = turn.loaded.state.pending
        if tokens >= turn.budget.compact_tokens or pending is not None:
            return await self._compact(turn, tokens_before, pending, None)
        if tokens >= turn.budget.prepare_tokens:
            self._prepare_ahead(turn, tokens)
        if view is messages:
            return Forward(chat.raw, chat.key, "none", turn.loaded.store, tokens, tokens)
        body = orjson.dumps({**chat.body, "messages": view})
        return Forward(body, chat.key, "replayed", turn.loaded.store, tokens_before, tokens)

    async def retry_harder(self, chat: Chat, previous: Forward) -> Forward:
        """The upstream said the prompt is too long: compact to half the target, once."""
        turn = await self._turn(chat)
        target = max(1, min(turn.budget.target_tokens, previous.tokens_after) // 2)
        forward = await self._compact(turn, previous.tokens_before, None, target)
        return dataclasses.replace(forward, can_retry=False)

    def observe_usage(self, chat: Chat, forward: Forward, usage: dict[str, Any] | None) -> None:
        """Calibrate the counter by the upstream's own count of what was forwarded."""
        prompt = usage.get("prompt_tokens") if usage else None
        if not isinstance(prompt, int) or prompt <= 0 or forward.tokens_after <= 0:
            return
        ratio = min(2.0, max(0.5, prompt / forward.tokens_after))
        old = self._calibration.get(chat.key)
        if old is None and len(self._calibration) >= 100_000:
            self._calibration.pop(next(iter(self._calibration)))
        self._calibration[chat.key] = ratio if old is None else 0.5 * old + 0.5 * ratio

    # -- steps ----------------------------------------------------------------------------

    async def _turn(self, chat: Chat) -> Turn:
        limits = self.limits(chat.model)
        loaded = await self._load(chat.key)
        budget = chat.policy.budget(limits.window, limits.max_output, chat.max_output)
        ratio = self._calibration.get(chat.key) or loaded.state.calibration or 1.0
        budget = _in_counted_tokens(budget, ratio)
        keys = content_keys(chat.messages)
        counts = limits.counter.counts(chat.messages, keys)
        chain = self.digests.chain(chat.messages, keys)
        fixed = limits.counter.fixed(chat.body)
        branch = loaded.state.branch(chain)
        return Turn(chat, limits, budget, fixed, counts, chain, loaded, branch)

    def _view(self, turn: Turn) -> list[dict[str, Any]]:
        if turn.branch is None:
            return turn.chat.messages
        role = turn.chat.policy.compaction.summary_role
        return policies.render(turn.chat.messages, turn.plan, summary_role=role)

    async def _compact(
        self, turn: Turn, tokens_before: int, instructions: str | None, target: int | None
    ) -> Forward:
        chat = turn.chat
        fence = await self._lock(turn, wait=True)
        try:
            # Another request may have compacted the session meanwhile (this one waited for
            # its lock): replay that plan when it is enough, except on the reactive path.
            if fence is not None and target is None and await self._reload(turn):
                replayed = self._replayed(turn, tokens_before)
                if replayed is not None:
                    return replayed
            result = await policies.compact(
                chat.messages,
                turn.plan,
                budget=turn.budget,
                params=chat.policy.compaction,
                counter=turn.limits.counter,
                fixed_tokens=turn.fixed,
                message_tokens=turn.counts,
                # Instructions are for a new summary: a prepared one never saw them.
                summarizer=self._summarizer(
                    turn, None if instructions else turn.loaded.state.prepared
                ),
                instructions=instructions or None,
                target_tokens=target,
            )
            if not result.fits:
                if turn.limits.counter.mode == "exact":
                    raise ContextLengthExceeded(_overflow_message(turn, result), param="messages")
                # An estimate (an unknown model, a guessed window) says nothing fits: forward
                # the request as it is and let the upstream judge. Nothing is stored: a plan
                # made from a wrong guess would strip every later turn of the session.
                return Forward(
                    chat.raw, chat.key, "none", turn.loaded.store, tokens_before, tokens_before
                )
            if result.plan != turn.plan or instructions is not None:
                await self._save(turn, result, fence)
        finally:
            if fence is not None:
                await self._unlock(chat.key, fence)
        body = orjson.dumps({**chat.body, "messages": result.view})
        return Forward(
            body,
            chat.key,
            "degraded" if result.degraded else "compacted",
            turn.loaded.store,
            tokens_before,
            result.tokens_after,
            result.decisions,
            anchors_complete=result.anchors_complete,
        )

    def _summarizer(self, turn: Turn, prepared: Prepared | None) -> policies.Summarizer:
        chat = turn.chat
        settings = chat.policy.summarizer
        upstream = self.config.upstreams[settings.upstream] if settings.upstream else chat.upstream
        model = settings.model or chat.model
        limits = self.limits(model)
        # The caller's credential only ever goes where the caller's request goes.
        credential = chat.credential if upstream is chat.upstream else None
        llm = LLMSummarizer(
            self.client,
            upstream,
            model,
            settings,
            credential=credential,
            counter=limits.counter,
            window=limits.window,
            metrics=self.metrics,
            cooldowns=self.cooldowns,
        )
        if prepared is None:
            return llm
        return functools.partial(_with_prepared, llm, prepared, turn.chain, limits.counter)

    # -- ahead of time --------------------------------------------------------------------

    def _prepare_ahead(self, turn: Turn, tokens: int) -> None:
        """Summarise in the background what the next compaction will most likely evict."""
        state = turn.loaded.state
        if turn.loaded.store != "ok" or _prepared_for(state.prepared, turn):
            return
        if any(task.get_name() == turn.chat.key for task in self._background):
            return
        self._spawn(self._prepare(turn, tokens), turn.chat.key)

    def _spawn(self, work: Coroutine[Any, Any, None], name: str) -> None:
        """Run `work` in the background; kept referenced until done, cancelled at shutdown."""
        task = asyncio.create_task(work, name=name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _prepare(self, turn: Turn, tokens: int) -> None:
        fence = await self._lock(turn, wait=False)
        if fence is None:
            return
        try:
            made: list[tuple[policies.SummaryRequest, str]] = []
            llm = self._summarizer(turn, None)

            async def recording(request: policies.SummaryRequest) -> str:
                text = await llm(request)
                made.append((request, text))
                return text

            # Evict as if the conversation had already grown to the compaction level.
            ahead = turn.budget.compact_tokens - tokens
            await policies.compact(
                turn.chat.messages,
                turn.plan,
                budget=turn.budget,
                params=turn.chat.policy.compaction,
                counter=turn.limits.counter,
                fixed_tokens=turn.fixed,
                message_tokens=turn.counts,
                summarizer=recording,
                target_tokens=max(1, turn.budget.target_tokens - ahead),
            )
            if made:
                request, text = made[-1]
                prepared = Prepared(
                    start=request.start,
                    end=request.end,
                    chain=turn.chain.prefix(request.end),
                    base=text_hash(made[0][0].previous),
                    text=text,
                )
                await self._update(
                    turn.chat.key,
                    lambda s: dataclasses.replace(s, prepared=prepared),
                    fence,
                )
        except Exception as exc:  # a background failure must never surface
            log.warning("summary ahead of time failed", extra={"error": type(exc).__name__})
        finally:
            await self._unlock(turn.chat.key, fence)

    # -- the store ------------------------------------------------------------------------

    async def _load(self, key: str) -> Loaded:
        try:
            record = await self.store.get(key)
        except StoreUnavailable:
            return self._store_failed("get")
        if record is None:
            return Loaded(SessionState(), 0, "ok")
        try:
            return Loaded(SessionState.from_bytes(record.data), record.version, "ok")
        except ValueError:
            log.warning("corrupt session state replaced", extra={"session": key[:12]})
            return Loaded(SessionState(), record.version, "ok")

    def _store_failed(self, operation: str) -> Loaded:
        self.metrics.store_errors.labels(operation).inc()
        if not self.config.store.fail_open:
            raise StoreUnavailableError("the session store is unavailable")
        log.warning("session store unavailable, serving fail-open", extra={"op": operation})
        return Loaded(SessionState(), 0, "unavailable")

    async def _save(self, turn: Turn, result: policies.Compaction, fence: int | None) -> None:
        chat = turn.chat
        old, new = turn.plan, result.plan
        chain = [m for m in chat.messages if not policies.is_system(m)]
        evicted = chain[old.cut : new.cut] + [
            chain[p] for p, edit in new.edits.items() if edit is None and p not in old.edits
        ]
        branch = Branch(new, turn.chain.prefix(new.covered), time.time())
        calibration = self._calibration.get(chat.key)
        max_branches = self.config.store.max_branches
        decisions = [decision_record(d) for d in result.decisions]
        candidates = memory_candidates(evicted)

        def apply(state: SessionState) -> SessionState:
            state = state.with_branch(branch, turn.chain, max_branches)
            state = state.with_decisions(decisions)
            state = state.with_memory(candidates)
            return dataclasses.replace(
                state,
                pending=None,
                prepared=None if new.cut != old.cut else state.prepared,
                calibration=calibration or state.calibration,
            )

        await self._update(chat.key, apply, fence, turn.loaded)

    async def _update(
        self,
        key: str,
        change: Any,
        fence: int | None,
        loaded: Loaded | None = None,
    ) -> bool:
        """Compare-and-set `change(state)`, re-reading on a conflict (a capped number of times)."""
        for _ in range(CAS_ATTEMPTS):
            if loaded is None:
                loaded = await self._load(key)
            if loaded.store != "ok":
                return False
            data = change(loaded.state).to_bytes()
            try:
                written = await self.store.compare_and_set(key, loaded.version, data, fence=fence)
            except StoreUnavailable:
                self._store_failed("compare_and_set")
                return False
            if written is not None:
                return True
            loaded = None
        log.warning("session state not written: concurrent updates", extra={"session": key[:12]})
        return False

    async def _lock(self, turn: Turn, *, wait: bool) -> int | None:
        """The session's lock (a fencing token); None without a store, or when another holds
        it (compacting or preparing a summary) beyond what this request may wait."""
        if turn.loaded.store != "ok":
            return None
        ttl = _lock_ttl(turn.chat.policy)
        deadline = time.monotonic() + ttl
        while True:
            try:
                token = await self.store.acquire_lock(turn.chat.key, ttl)
            except StoreUnavailable:
                self._store_failed("lock")
                return None
            if token is not None or not wait or time.monotonic() >= deadline:
                return token
            await asyncio.sleep(LOCK_POLL_SECONDS)

    async def _unlock(self, key: str, token: int) -> None:
        try:
            await self.store.release_lock(key, token)
        except StoreUnavailable:
            self._store_failed("unlock")

    async def _reload(self, turn: Turn) -> bool:
        """Read the session again: whether it changed since `turn` was read (`turn` then
        holds the new state)."""
        loaded = await self._load(turn.chat.key)
        if loaded.store != "ok" or loaded.version == turn.loaded.version:
            return False
        turn.loaded = loaded
        turn.branch = loaded.state.branch(turn.chain)
        return True

    def _replayed(self, turn: Turn, tokens_before: int) -> Forward | None:
        """The session's plan replayed, when it brings this request under the compaction
        level and no manual compaction is pending."""
        if turn.branch is None or turn.loaded.state.pending is not None:
            return None
        view = self._view(turn)
        tokens = turn.tokens(view)
        if tokens >= turn.budget.compact_tokens:
            return None
        body = orjson.dumps({**turn.chat.body, "messages": view})
        return Forward(body, turn.chat.key, "replayed", "ok", tokens_before, tokens)


def _in_counted_tokens(budget: policies.Budget, ratio: float) -> policies.Budget:
    """The budget in the counter's tokens when the upstream counts `ratio` times as many
    (calibration): every level, the target too, then holds in the upstream's own tokens."""
    if ratio == 1.0:
        return budget
    return dataclasses.replace(
        budget,
        limit=int(budget.limit / ratio),
        prepare_tokens=int(budget.prepare_tokens / ratio),
        compact_tokens=int(budget.compact_tokens / ratio),
        target_tokens=int(budget.target_tokens / ratio),
    )


def _lock_ttl(policy: Policy) -> float:
    settings = policy.summarizer
    return settings.timeout_seconds * (settings.retries + 1) + 5


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


def _overflow_message(turn: Turn, result: policies.Compaction) -> str:
    budget = turn.budget
    return (
        f"This model's maximum context length is {turn.limits.window} tokens. Even after "
        f"compaction, the system messages and the current turn need {result.floor_tokens} "
        f"tokens, and {budget.reserved_output} are reserved for the output, which leaves "
        f"{budget.limit} tokens for the prompt. Please shorten the current message or the "
        "system prompt, or lower max_tokens."
    )
