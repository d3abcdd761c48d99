"""LLM summaries of evicted history, through the proxy's own HTTP client.

The `summarize` layer (policies/) gets one of these as its injected summarizer. Failures
raise: the layer then falls back to the mechanical digest, so nothing is lost (transactional).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Sequence
from typing import Protocol

import policies
from policies.message import call_arguments, call_name, tool_calls
from proxy.compaction.cooldowns import Cooldowns, Scope, blamed_scope
from proxy.compaction.turn import ClientRequest
from proxy.config import Config, Policy, Upstream
from proxy.config import Summarizer as SummarizerSettings
from proxy.dialects import Dialect, Entitlements, dialect_of_kind
from proxy.errors import SummaryFailed, SummaryTooShort
from proxy.models.limits import ModelLimits
from proxy.observability.metrics import Metrics
from proxy.upstream.answer import read_whole
from proxy.upstream.client import UpstreamClient

log = logging.getLogger("compaction_proxy")

# The fake upstream of the tests recognises summary requests by this opening, and so can an
# operator reading upstream logs.
SYSTEM_PROMPT = """You are compacting a conversation between a user and an AI assistant so that \
it can go on within a limited context window. Write an updated, structured summary that merges \
the previous summary (if any) with the new messages. Use these sections, in this order, and keep \
each one short:

## Goal
## Facts
## Work done (files read or changed, commands run, what their outputs showed)
## Decisions
## Errors still open
## User preferences and constraints
## Open todos / next steps
## Timeline

Keep identifiers, file paths, URLs, numbers, names, quoted user requirements and the findings and \
error lines of tool outputs verbatim. Update \
the previous summary rather than rewriting it: keep what still holds, add what is new, mark what \
was resolved. Write only the summary, no preamble."""

SUMMARY_HEADER = ("x-compaction-summary", "1")
# Instructions for a summary (from a pre_compact hook or the admin API) are bounded: they go
# into every summary request of the session.
MAX_INSTRUCTIONS = 4000


def transcript(messages: list[policies.Message]) -> str:
    """The evicted messages as plain text lines for the summarizer."""
    lines = []
    for message in messages:
        role = message.get("role", "?")
        text = policies.content_text(message.get("content"))
        for call in tool_calls(message):
            text += f"\n-> call {call_name(call)}({call_arguments(call)})"
        name = message.get("name")
        label = f"{role} {name}" if name else role
        lines.append(f"[{label}] {text.strip()}")
    return "\n".join(lines)


def text_hash(summary: policies.Summary | None) -> str:
    text = summary.shown if summary else ""
    return hashlib.blake2b(text.encode(), digest_size=12).hexdigest()


class _Status(SummaryFailed):  # a signal inside this module: the upstream's status
    def __init__(self, status: int) -> None:
        super().__init__(f"status {status}")
        self.status = status


class GuardedSummarizer(Protocol):
    """A summarizer behind circuit breakers: `cooling` while one is open (a summary would
    fail at once, with no call made)."""

    @property
    def cooling(self) -> bool: ...

    async def __call__(self, request: policies.SummaryRequest) -> str: ...


class SummarizerFactory(Protocol):
    def for_request(self, request: ClientRequest) -> GuardedSummarizer | None:
        """The summarizer of one request; None: the mechanical digest stands in for summaries
        (an offline replay)."""
        ...


class Summarizers:
    """Makes the summarizer of one request: the policy's configured summarizer upstream and
    model, else the request's own upstream and model with the request's own credential."""

    def __init__(
        self, config: Config, client: UpstreamClient, limits: ModelLimits, metrics: Metrics
    ) -> None:
        self.config = config
        self.client = client
        self.limits = limits
        self.metrics = metrics
        self.cooldowns = Cooldowns()

    def for_request(self, request: ClientRequest) -> LLMSummarizer | None:
        """None when the summary would go to the request's own upstream on a client
        credential that is only for the client's own requests (a Claude subscription's
        token): the mechanical digest stands in."""
        settings = request.policy.summarizer
        upstream = request.upstream
        chosen = self.config.upstreams[settings.upstream] if settings.upstream else upstream
        reuse = chosen is upstream and not upstream.api_key
        dialect = request.dialect
        if (
            reuse
            and isinstance(dialect, Entitlements)
            and not dialect.may_reuse_credentials(request.credentials)
        ):
            return None
        model = settings.model or request.parsed.model
        limits = self.limits.limits(model, chosen)
        # The caller's credential only ever goes where the caller's request goes.
        credentials = request.credentials if chosen is upstream else ()
        return LLMSummarizer(
            self.client,
            chosen,
            # The request's own API on its own upstream; a configured summarizer's main one.
            dialect if chosen is upstream else dialect_of_kind(chosen.kind),
            model,
            settings,
            credentials=credentials,
            counter=limits.counter,
            window=limits.window,
            metrics=self.metrics,
            cooldowns=self.cooldowns,
        )


def lock_seconds(policy: Policy) -> float:
    """How long one summary may hold a session's lock: every attempt, and a margin."""
    settings = policy.summarizer
    return settings.timeout_seconds * (settings.retries + 1) + 5


class LLMSummarizer:
    """Summarises with one model on one upstream, in chunks that fit the model's window."""

    def __init__(
        self,
        client: UpstreamClient,
        upstream: Upstream,
        dialect: Dialect,
        model: str,
        settings: SummarizerSettings,
        *,
        credentials: Sequence[tuple[str, str]],
        counter: policies.Counter,
        window: int,
        metrics: Metrics,
        cooldowns: Cooldowns,
    ) -> None:
        self.client = client
        self.upstream = upstream
        self.dialect = dialect
        self.model = model
        self.settings = settings
        self.credentials = credentials  # held for this task only, never stored
        self.counter = counter
        self.window = window
        self.metrics = metrics
        self.cooldowns = cooldowns
        self.calls = 0

    @property
    def breakers(self) -> dict[Scope, str]:
        """The breakers of the credential the calls carry and of the upstream for this model."""
        return self.cooldowns.breakers(self.upstream, self.credentials, self.model)

    @property
    def cooling(self) -> bool:
        """Whether a breaker is open: a summary would fail at once, with no call made."""
        return self.cooldowns.cooling(*self.breakers.values())

    async def __call__(self, request: policies.SummaryRequest) -> str:
        if policies.too_short(request, self.counter.message):
            self.metrics.summaries.labels("too_short").inc()
            raise SummaryTooShort(f"a summary of {request.max_tokens} tokens for too much")
        previous = request.previous
        text = ""
        for chunk in self._chunks(request):
            text = await self._summarise(previous, chunk, request.max_tokens, request.instructions)
            previous = policies.Summary(text, "llm")
        return text

    def _chunks(self, request: policies.SummaryRequest) -> list[list[policies.Message]]:
        """Groups of evicted messages whose prompt fits the summarizer's own window."""
        fixed = self.counter.text(SYSTEM_PROMPT) + request.max_tokens + 64
        if request.previous is not None:
            fixed += self.counter.text(request.previous.shown)
        room = max(256, self.window - fixed - max(256, self.window // 10))
        chunks: list[list[policies.Message]] = [[]]
        size = 0
        for message in request.evicted:
            tokens = self.counter.message(message)
            if chunks[-1] and size + tokens > room:
                chunks.append([])
                size = 0
            chunks[-1].append(_fitted(message, room, self.counter))
            size += tokens
        return chunks

    async def _summarise(
        self,
        previous: policies.Summary | None,
        messages: list[policies.Message],
        max_tokens: int,
        instructions: str | None,
    ) -> str:
        breakers = self.breakers
        if self.cooldowns.cooling(*breakers.values()):
            self.metrics.summaries.labels("cooling_down").inc()
            raise SummaryFailed("summarizer cooling down after repeated failures")
        body = self.dialect.summary_body(
            self.model,
            SYSTEM_PROMPT,
            _prompt(previous, messages, instructions),
            max_tokens,
            self.settings.temperature,
        )
        headers = [("Content-Type", "application/json"), SUMMARY_HEADER, *self.credentials]
        carried = {name.lower() for name, _ in self.credentials}
        headers += [(n, v) for n, v in self.dialect.call_headers.items() if n not in carried]
        failure: str = "no attempt"
        scope: Scope = "upstream"
        for _ in range(1 + self.settings.retries):
            self.calls += 1
            try:
                async with asyncio.timeout(self.settings.timeout_seconds):
                    text = await self._attempt(headers, body)
            except TimeoutError:
                failure, scope = "timeout", "upstream"
            except Exception as exc:  # every failure is retried, then degrades
                failure, scope = _blamed(exc)
            else:
                if text:
                    self.metrics.summaries.labels("ok").inc()
                    return text
                failure, scope = "empty", "upstream"
            self.metrics.summaries.labels(failure if failure in _OUTCOMES else "error").inc()
        self.cooldowns.trip(breakers[scope], self.settings.cooldown_seconds)
        self.metrics.cooldowns.labels(scope).inc()
        log.warning(
            "summarizer failed",
            extra={"reason": failure, "upstream": self.upstream.name, "cooling": scope},
        )
        raise SummaryFailed(failure)

    async def _attempt(self, headers: list[tuple[str, str]], body: bytes) -> str:
        path = self.dialect.upstream_path
        # The summarizer's own retries stand in for the upstream's (the two would multiply).
        response = await self.client.open(
            self.upstream, "POST", path, "", list(headers), body, retries=0
        )
        try:
            timeout = self.settings.timeout_seconds
            payload = await read_whole(response, timeout, self.upstream.max_answer_bytes)
        finally:
            response.release()
        if response.status != 200:
            raise _Status(response.status)
        return self.dialect.summary_text(payload).strip()


_OUTCOMES = {"timeout", "empty", "overlong"}


def _blamed(exc: Exception) -> tuple[str, Scope]:
    """Why an attempt failed, and what to cool: the credential when the upstream refused it
    or rate-limited it, else the upstream (errors, timeouts, answers that were no summary)."""
    if isinstance(exc, _Status) and blamed_scope(exc.status) == "credential":
        return str(exc), "credential"
    return (str(exc) if isinstance(exc, SummaryFailed) else type(exc).__name__), "upstream"


def _prompt(
    previous: policies.Summary | None, messages: list[policies.Message], instructions: str | None
) -> str:
    parts = []
    if previous is not None:
        kind = "summary" if previous.kind == "llm" else "mechanical digest"
        parts.append(f"Previous {kind}:\n{previous.text}")
        if previous.tail:
            parts.append(f"Mechanical digest of the messages after that summary:\n{previous.tail}")
    parts.append(f"New messages:\n{transcript(messages)}")
    if instructions:
        parts.append(f"Additional instructions for this summary:\n{instructions}")
    return "\n\n".join(parts)


def _fitted(message: policies.Message, room: int, counter: policies.Counter) -> policies.Message:
    """A message too big for one chunk keeps its head (a summary cannot use more anyway)."""
    if counter.message(message) <= room:
        return message
    text = counter.head(policies.content_text(message.get("content")), room)
    return {**message, "content": text + " [...]"}
