"""Wiring the pure compaction pipeline (`policies/`) to a request.

Count the conversation, work out the budget, compact when it is at or over the policy's
`compact_at` level, and say what was done. Nothing here touches the network.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Any

import orjson

import policies

from .config import Config, Policy
from .errors import ContextLengthExceeded
from .metrics import Metrics
from .models import ModelCatalog
from .store import SessionStore, StoreUnavailable, session_key
from .tokens import TokenCounter, counter_for

log = logging.getLogger("compaction_proxy")


@dataclasses.dataclass(frozen=True)
class Chat:
    """One chat completion request, as the proxy understood it."""

    tenant: str
    session: str
    model: str
    body: dict[str, Any]
    raw: bytes
    policy: Policy
    max_output: int | None
    credential: str | None

    @functools.cached_property
    def key(self) -> str:
        return session_key(self.tenant, self.session)


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
            ("x-compaction-session", self.session_hash[:16]),
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


class Compactor:
    def __init__(self, config: Config, store: SessionStore, metrics: Metrics) -> None:
        self.config = config
        self.store = store
        self.metrics = metrics
        self.catalog = ModelCatalog()
        self._limits: dict[str, Limits] = {}

    def warm_up(self) -> None:
        """Load the tokenizers and the model map now rather than on the first request."""
        for model in ("gpt-4o", "gpt-4"):
            self.limits(model).counter.text("warm up")

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

    def budget(self, chat: Chat, limits: Limits) -> policies.Budget:
        policy = chat.policy
        return policies.make_budget(
            window=limits.window,
            model_max_output=limits.max_output,
            request_max_tokens=chat.max_output,
            reserved_output_tokens=policy.reserved_output_tokens,
            safety_margin_tokens=policy.safety_margin_tokens,
            prepare_at=policy.prepare_at,
            compact_at=policy.compact_at,
            target=policy.target,
        )

    async def prepare(self, chat: Chat) -> Forward:
        store = await self._probe_store(chat)
        limits = self.limits(chat.model)
        budget = self.budget(chat, limits)
        messages: list[dict[str, Any]] = chat.body["messages"]
        fixed = limits.counter.fixed(chat.body)
        tokens = limits.counter.count(messages, fixed=fixed)
        if tokens < budget.compact_tokens:
            return Forward(chat.raw, chat.key, "none", store, tokens, tokens)
        return await self._compact(chat, limits, budget, store, tokens, None)

    async def retry_harder(self, chat: Chat, previous: Forward) -> Forward:
        """The upstream said the prompt is too long: compact to half the target, once."""
        limits = self.limits(chat.model)
        budget = self.budget(chat, limits)
        forward = await self._compact(
            chat,
            limits,
            budget,
            previous.store,
            previous.tokens_before,
            max(1, min(budget.target_tokens, previous.tokens_after) // 2),
        )
        return dataclasses.replace(forward, can_retry=False)

    async def _compact(
        self,
        chat: Chat,
        limits: Limits,
        budget: policies.Budget,
        store: str,
        tokens: int,
        target: int | None,
    ) -> Forward:
        messages: list[dict[str, Any]] = chat.body["messages"]
        fixed = limits.counter.fixed(chat.body)
        result = await policies.compact(
            messages,
            policies.Plan(),
            budget=budget,
            params=chat.policy.compaction,
            counter=limits.counter,
            fixed_tokens=fixed,
            target_tokens=target,
        )
        if not result.fits and limits.counter.mode == "exact":
            raise ContextLengthExceeded(_overflow_message(limits, budget, result), param="messages")
        body = orjson.dumps({**chat.body, "messages": result.view})
        return Forward(
            body,
            chat.key,
            "degraded" if result.degraded else "compacted",
            store,
            tokens,
            result.tokens_after,
            tuple(result.decisions),
            anchors_complete=result.anchors_complete,
        )

    async def _probe_store(self, chat: Chat) -> str:
        try:
            await self.store.get(chat.key)
        except StoreUnavailable:
            self.metrics.store_errors.labels("get").inc()
            return "unavailable"
        return "ok"

    def observe_usage(self, chat: Chat, forward: Forward, usage: dict[str, Any] | None) -> None:
        """Calibration from the upstream's own count (issue 4 builds on this)."""


def _overflow_message(
    limits: Limits, budget: policies.Budget, result: policies.Compaction
) -> str:
    return (
        f"This model's maximum context length is {limits.window} tokens. Even after compaction, "
        f"the system messages and the current turn need {result.tokens_after} tokens, and "
        f"{budget.reserved_output} are reserved for the output "
        f"(limit {budget.limit} tokens for the prompt). Please shorten the current message "
        "or the system prompt, or lower max_tokens."
    )
