"""The compactor on its own: a memory store and a fake summarizer, no network.

The end-to-end behaviour (through the real SDK, the fake upstream and Redis) is in
test_stateful.py; these pin the decisions themselves.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.compaction.compactor import Compactor
from proxy.compaction.prepared import PreparedSummaries
from proxy.compaction.turn import ClientRequest
from proxy.config import Config, loads
from proxy.dialects.openai.chat import Chat
from proxy.errors import ContextLengthExceeded, StoreUnavailable
from proxy.models.calibration import Calibration
from proxy.models.limits import ModelLimits
from proxy.observability.metrics import Metrics
from proxy.sessions.sessions import Sessions
from proxy.sessions.state import SessionState
from proxy.sessions.store import MemoryStore
from tests.conftest import examples
from tests.doubles import FailingStore, FakeSummarizer
from tests.harness import history, said

MODEL = "gpt-4"  # counted exactly
CONFIG = """
upstreams:
  fake: {base_url: "http://127.0.0.1:9/v1"}
models:
  - {match: "gpt-4", context_window: 4096}
policies:
  default: {reserved_output_tokens: 512}
"""


@dataclasses.dataclass
class Parts:
    config: Config
    store: MemoryStore
    summarizer: FakeSummarizer
    compactor: Compactor
    metrics: Metrics

    def request(self, messages: list[dict[str, Any]], session: str = "s1") -> ClientRequest:
        dialect = Chat()
        policy, upstream = self.config.route(dialect.name, MODEL, None)
        raw = orjson.dumps({"model": MODEL, "messages": messages})
        return ClientRequest(dialect, dialect.parse(raw), "tenant", session, policy, upstream, ())


def parts(
    store: MemoryStore | None = None, *, fail_open: bool = True, config_text: str = CONFIG
) -> Parts:
    config = loads(config_text)
    store = store or MemoryStore(ttl_seconds=60)
    metrics = Metrics()
    summarizer = FakeSummarizer()
    sessions = Sessions(store, metrics, fail_open=fail_open)
    compactor = Compactor(
        sessions,
        ModelLimits(config),
        PreparedSummaries(sessions, summarizer, metrics),
        Calibration(),
    )
    return Parts(config, store, summarizer, compactor, metrics)


def forwarded(body: bytes) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = orjson.loads(body)["messages"]
    return messages


async def test_a_short_conversation_goes_out_as_the_client_sent_it() -> None:
    p = parts()
    request = p.request(history(2))
    forward = await p.compactor.prepare(request)
    assert (forward.action, forward.store) == ("none", "ok")
    assert forward.body is request.parsed.raw  # the client's own bytes
    assert await p.store.get(request.key) is None  # nothing to remember


async def test_over_the_level_it_compacts_and_the_next_turn_replays() -> None:
    p = parts()
    messages = history(40)
    forward = await p.compactor.prepare(p.request(messages))
    assert forward.action == "compacted"
    assert forward.tokens_after < forward.tokens_before
    assert p.summarizer.requests, "the summarize layer asked the summarizer"
    first = forwarded(forward.body)

    grown = [*messages, {"role": "assistant", "content": "Noted."}, *history(41)[-1:]]
    again = await p.compactor.prepare(p.request(grown))
    assert again.action == "replayed"
    assert forwarded(again.body)[: len(first)] == first  # the view only grows at its end


async def test_a_failing_summarizer_degrades_to_the_digest() -> None:
    p = parts()
    p.summarizer.answer = RuntimeError("summarizer down")
    forward = await p.compactor.prepare(p.request(history(40)))
    assert forward.action == "degraded"
    header = forwarded(forward.body)[1]["content"]
    assert header.startswith("[Digest of the earlier conversation")


async def test_with_the_store_down_it_compacts_from_the_request_alone() -> None:
    p = parts(FailingStore(ttl_seconds=60))
    forward = await p.compactor.prepare(p.request(history(40)))
    assert (forward.action, forward.store) == ("compacted", "unavailable")
    assert p.metrics.store_errors.labels("get").value == 1


async def test_with_the_store_down_and_fail_closed_it_refuses() -> None:
    p = parts(FailingStore(ttl_seconds=60), fail_open=False)
    with pytest.raises(StoreUnavailable):
        await p.compactor.prepare(p.request(history(40)))


async def test_a_turn_that_cannot_fit_is_a_context_length_error() -> None:
    p = parts()
    huge = [{"role": "user", "content": "word " * 5000}]
    with pytest.raises(ContextLengthExceeded, match="maximum context length is 4096"):
        await p.compactor.prepare(p.request(huge))


async def test_max_tokens_that_leave_no_room_forward_unchanged() -> None:
    relay = CONFIG.replace(
        "{reserved_output_tokens: 512}", "{reserved_output_tokens: 512, max_tokens_overflow: relay}"
    )
    p = parts(config_text=relay)
    body = {"model": MODEL, "messages": history(40), "max_tokens": 5000}
    dialect = Chat()
    policy, upstream = p.config.route("chat", MODEL, None)
    parsed = dialect.parse(orjson.dumps(body))
    request = ClientRequest(dialect, parsed, "tenant", "s1", policy, upstream, ())
    forward = await p.compactor.prepare(request)
    assert forward.action == "none"
    assert forward.body is parsed.raw
    # An overflow is not compacted into no room either.
    assert await p.compactor.retry_harder(request, forward) is forward

    # By default such a max_tokens counts as the usual output: compacted to leave it room
    # (the upstream's overflow then lowers max_tokens).
    p = parts()
    policy, upstream = p.config.route("chat", MODEL, None)
    request = ClientRequest(dialect, parsed, "tenant", "s1", policy, upstream, ())
    forward = await p.compactor.prepare(request)
    assert forward.action in ("compacted", "degraded")
    assert forward.reserved_output == 512


async def test_retry_harder_halves_the_target_once() -> None:
    p = parts()
    request = p.request(history(40))
    first = await p.compactor.prepare(request)
    harder = await p.compactor.retry_harder(request, first)
    assert not harder.can_retry
    assert harder.tokens_after <= first.tokens_after // 2 + 64


async def test_concurrent_requests_of_one_session_compact_once() -> None:
    p = parts()
    messages = history(40)
    results = await asyncio.gather(*(p.compactor.prepare(p.request(messages)) for _ in range(4)))
    actions = sorted(f.action for f in results)
    assert actions.count("compacted") == 1, actions
    assert set(actions) <= {"compacted", "replayed"}
    assert len({f.body for f in results}) == 1  # one plan, the same view for all


async def test_sessions_of_two_tenants_never_share_a_plan() -> None:
    p = parts()
    messages = history(40)
    one = p.request(messages)
    other = dataclasses.replace(one, tenant="someone-else")
    await p.compactor.prepare(one)
    assert (await p.compactor.prepare(other)).action == "compacted"  # not "replayed"


# Summaries only on the request path (prepare_at is compact_at): no background work.
ON_THE_REQUEST_PATH = CONFIG.replace("512}", "512, prepare_at: 0.9}")


@settings(max_examples=examples(30), deadline=None, suppress_health_check=list(HealthCheck))
@given(
    turns=st.lists(st.tuples(st.integers(20, 600), st.booleans()), min_size=1, max_size=30),
    answer=st.sampled_from(["A short summary.", RuntimeError("summarizer down")]),
)
def test_shadow_mode_forwards_the_client_bytes_and_stores_the_plan_it_would(
    turns: list[tuple[int, bool]], answer: str | Exception
) -> None:
    """One conversation sent to two sessions: one compacted for real, the other under shadow
    mode on the turns that say so. Both make the same decisions and store the same plans; the
    shadowed turns go out as the client sent them."""
    asyncio.run(shadowed_sessions(turns, answer))


async def shadowed_sessions(turns: list[tuple[int, bool]], answer: str | Exception) -> None:
    p = parts(config_text=ON_THE_REQUEST_PATH)
    p.summarizer.answer = answer
    messages = history(0)[:-1]
    for turn, (size, shadow) in enumerate(turns):
        messages.append({"role": "user", "content": said(turn, size)})
        real = await p.compactor.prepare(p.request(messages, "real"))
        request = dataclasses.replace(p.request(messages, "shadowed"), shadow=shadow)
        would = await p.compactor.prepare(request)
        if shadow:
            assert would.body is request.parsed.raw
            assert (would.applied, would.tokens_sent) == ("none", would.tokens_before)
            headers = dict(would.headers())
            assert headers["x-compaction-shadow"] == "true"
            assert headers["x-compaction-action"] == f"shadow-{real.action}"
        else:
            assert would.body == real.body
        assert (would.action, would.tokens_after) == (real.action, real.tokens_after)
        assert await plans(p, request.key) == await plans(p, p.request(messages, "real").key)
        messages.append({"role": "assistant", "content": "Noted."})


async def plans(p: Parts, key: str) -> list[dict[str, Any]]:
    """The plans the session stores (its branches without their times of use)."""
    record = await p.store.get(key)
    if record is None:
        return []
    return [branch.plan.to_dict() for branch in SessionState.from_bytes(record.data).branches]
