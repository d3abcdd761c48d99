"""The one promise of an exactly counted model, as a property: over random sessions (chat,
images the proxy over-counts, tool results), with random usage the upstream reports (any
calibration ratio) and a summarizer that fails at random, no request the proxy forwards is
over its budget by the proxy's own exact count; it is refused instead when even its system
messages and current turn cannot fit."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.compaction.turn import ClientRequest
from proxy.config import Config
from proxy.dialects.openai.chat import Chat
from proxy.errors import ContextLengthExceeded
from proxy.models.tokens import counter_for
from proxy.observability.metrics import Metrics
from proxy.server.app import Proxy
from proxy.sessions.store import MemoryStore
from proxy.upstream.client import UpstreamClient
from tests.conftest import config_for, examples
from tests.conversations import words
from tests.fakes.openai import FakeUpstream

WINDOWS = {"gpt-4o-4k": 4096, "gpt-4o-8k": 8192, "gpt-4o-16k": 16384}
IMAGE = {"type": "image_url", "image_url": {"url": "https://x.test/a.png"}}  # 765 by the proxy


class Failures:
    """The fake's summarizer hook: fails when the schedule says so, else a short summary."""

    def __init__(self) -> None:
        self.schedule: list[bool] = [False]
        self.calls = 0

    def __call__(self, body: dict[str, Any]) -> str | Exception:
        failed = self.schedule[self.calls % len(self.schedule)]
        self.calls += 1
        return RuntimeError("down") if failed else "Summary: the user and the assistant talked."


@pytest.fixture(scope="module")
def fake() -> Iterator[tuple[FakeUpstream, Failures]]:
    failures = Failures()
    with FakeUpstream(windows=WINDOWS, summarizer=failures) as up:
        yield up, failures


def config(up: FakeUpstream) -> Config:
    settings = {"retries": 0, "cooldown_seconds": 0.01, "request_wait_seconds": 2}
    return config_for(
        up,
        models=[{"match": m, "context_window": w} for m, w in WINDOWS.items()],
        policies={"default": {"summarizer": settings}},
    )


def turn_messages(kind: str, size: int, turn: int) -> list[dict[str, Any]]:
    """What a client adds in one turn: the assistant's answer to the last one, and more."""
    text = words(size, turn)
    if kind == "image":
        parts = [{"type": "text", "text": text}, IMAGE, IMAGE]
        return [{"role": "assistant", "content": "Noted."}, {"role": "user", "content": parts}]
    if kind == "tool":
        call = {
            "id": f"call_{turn}",
            "type": "function",
            "function": {"name": "search", "arguments": json.dumps({"q": words(8, turn)})},
        }
        return [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call["id"], "content": text * 3},
        ]
    return [
        {"role": "assistant", "content": words(size // 2, turn)},
        {"role": "user", "content": text},
    ]


TURNS = st.lists(
    st.tuples(
        st.sampled_from(["chat", "chat", "image", "tool"]),
        st.integers(5, 700),  # words
        st.floats(0.1, 8.0),  # the upstream's count over the proxy's, for this turn
    ),
    min_size=4,
    max_size=24,
)


@settings(max_examples=examples(40), deadline=None, suppress_health_check=list(HealthCheck))
@given(
    turns=TURNS,
    model=st.sampled_from(sorted(WINDOWS)),
    max_tokens=st.sampled_from([None, 256, 1024]),
    failing=st.lists(st.booleans(), min_size=1, max_size=6),
)
def test_no_forwarded_request_is_over_its_budget_by_the_proxys_exact_count(
    fake: tuple[FakeUpstream, Failures],
    turns: list[tuple[str, int, float]],
    model: str,
    max_tokens: int | None,
    failing: list[bool],
) -> None:
    up, failures = fake
    failures.schedule = failing
    asyncio.run(session(config(up), model, max_tokens, turns))


async def session(
    config: Config, model: str, max_tokens: int | None, turns: list[tuple[str, int, float]]
) -> None:
    metrics = Metrics()
    proxy = Proxy(config, MemoryStore(ttl_seconds=600), UpstreamClient(metrics), metrics)
    compactor = proxy.compactor
    counter = counter_for(model)
    limits = proxy.limits.limits(model)
    dialect = Chat()
    policy, upstream = config.route(dialect.name, model, None)
    budget = policy.compaction.budget(limits.window, limits.max_output, max_tokens)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hello."},
    ]
    extra = {} if max_tokens is None else {"max_tokens": max_tokens}
    try:
        for turn, (kind, size, ratio) in enumerate(turns):
            messages += turn_messages(kind, size, turn)
            body = orjson.dumps({"model": model, "messages": messages, **extra})
            request = ClientRequest(
                dialect=dialect,
                parsed=dialect.parse(body),
                tenant="property",
                session="s",
                policy=policy,
                upstream=upstream,
                credentials=(),
            )
            try:
                forward = await compactor.prepare(request)
            except ContextLengthExceeded:
                continue  # refused with the clear 400: the current turn alone is too long
            sent = orjson.loads(forward.body)
            tokens = counter.count(sent["messages"], fixed=counter.fixed(sent))
            assert tokens == forward.tokens_after
            assert tokens <= budget.limit, (forward.action, tokens, budget)
            compactor.calibrate(request, forward, max(1, int(tokens * ratio)))
            await asyncio.sleep(0)  # a summary in the background may move on
    finally:
        await proxy.prepared.close()
        await proxy.client.close()
