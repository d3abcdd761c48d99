"""Every Anthropic view obeys the Messages API's ordering rules, on every path: a compaction
(every layer, any summary role, any target: the reactive path's too), the plan replayed on
the conversation as it goes on, a compaction from that plan, with and without the proxy's
breakpoints.

The histories are Claude Code's: `system` messages inside `messages` (beta
`mid-conversation-system-2026-04-07`), as strings or text blocks, after user turns (tool
results too), and at the end. The strict fake checks what the API checks: a system message
only right after a user turn (so never first), each tool_use answered at the start of the
next user turn and each tool_result answered for, non-empty messages and texts, thinking
first and signed, at most four breakpoints in TTL order."""

from __future__ import annotations

import copy
import itertools
import json
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import policies
from policies.policy import SUMMARY_ROLES
from tests.conftest import examples
from tests.conversations import unmarked
from tests.conversations import words as plain_words
from tests.fakes.anthropic import AnthropicError, FakeAnthropic
from tests.fakes.base import RECORDING_KEY
from tests.test_messages_mapping import (
    COUNTER,
    FAKE,
    HEALTH,
    LAYERS,
    MARK,
    MESSAGES,
    TOOLS,
    histories,
    parse,
    text,
)

BETA = {"anthropic-beta": "mid-conversation-system-2026-04-07"}


@st.composite
def with_systems(draw: st.DrawFn) -> tuple[list[dict[str, Any]], bool]:
    """A history of `histories`, with system messages after some of its user turns, and one
    more round of it to come (the conversation as it goes on)."""
    messages, thinking = draw(histories())
    free = 4 - orjson.dumps(messages).count(b"cache_control")  # the client's request is valid
    out: list[dict[str, Any]] = []
    for message in messages:
        out.append(message)
        if message["role"] == "user" and draw(st.integers(0, 2)) == 0:
            said = plain_words(draw(st.integers(1, 60)), draw(st.integers(0, 999)))
            form = draw(st.sampled_from(["string", "blocks", "marked"][: 3 if free else 2]))
            free -= form == "marked"
            content: Any = said
            if form != "string":
                content = [text(said, **({"cache_control": MARK} if form == "marked" else {}))]
            out.append({"role": "system", "content": content})
    return out, thinking


def valid(body: dict[str, Any]) -> None:
    try:
        FAKE.count(body, BETA)
    except AnthropicError as error:
        raise AssertionError(error.message) from None
    roles = [m["role"] for m in body["messages"]]
    assert roles and roles[0] != "system"


@settings(max_examples=examples(300), deadline=None, suppress_health_check=HEALTH)
@given(history=with_systems(), data=st.data())
async def test_every_view_on_every_path_keeps_the_apis_order(
    history: Any, data: st.DataObject
) -> None:
    messages, thinking = history
    fields: dict[str, Any] = {"system": [text("You are an agent.")], "tools": TOOLS}
    if thinking:
        fields["thinking"] = {"type": "enabled", "budget_tokens": 1024}
    cut = data.draw(st.integers(1, len(messages)))
    if messages[cut - 1]["role"] == "assistant":
        cut -= 1  # a request ends with the client's turn
    earlier, later = messages[:cut] or messages, messages
    role = data.draw(st.sampled_from(SUMMARY_ROLES))
    policy = policies.Policy(
        reserved_output_tokens=100,
        protect_min_tokens=100,
        protect_recent_rounds=1,
        summary_role=role,
        layers=tuple(data.draw(st.lists(st.sampled_from(LAYERS), min_size=1, unique=True))),
    )
    window = data.draw(st.sampled_from([600, 1200, 2400, 4800]))
    marks = data.draw(st.booleans())

    async def compacted(history: list[dict[str, Any]], plan: policies.Plan) -> policies.Plan:
        parsed = parse(copy.deepcopy(history), **fields)
        target = data.draw(st.one_of(st.none(), st.integers(1, window)))  # reactive: any
        result = await policies.compact(
            parsed.messages,
            plan,
            budget=policy.budget(window, None, None),
            policy=policy,
            counter=COUNTER,
            fixed_tokens=MESSAGES.fixed_tokens(parsed, COUNTER),
            target_tokens=target,
        )
        shown(history, result.plan)
        return result.plan

    def shown(history: list[dict[str, Any]], plan: policies.Plan) -> None:
        parsed = parse(copy.deepcopy(history), **fields)
        entries = policies.render_entries(parsed.messages, plan, summary_role=role)
        valid(orjson.loads(MESSAGES.render(parsed, entries, marks)))

    valid(orjson.loads(parse(copy.deepcopy(later), **fields).raw))  # as the client sent it
    plan = await compacted(earlier, policies.Plan())
    if len(later) > len(earlier):
        shown(later, plan)  # replayed as the conversation goes on
        await compacted(later, plan)


RECORDED = Path(__file__).resolve().parent / "data/clients/claude-mid-loop.json"


@pytest.mark.parametrize("window", [12_000, 16_000, 20_000])
@pytest.mark.parametrize("role", SUMMARY_ROLES)
async def test_claude_codes_recorded_loop_compacted_keeps_the_apis_order(
    window: int, role: str
) -> None:
    """Claude Code's own request (system messages after tool results, one last), its head
    evicted at windows that cut through it, is one the API takes."""
    fixture = json.loads(RECORDED.read_text())
    body, headers = fixture["body"], fixture["headers"]
    fake = FakeAnthropic(signing_key=RECORDING_KEY)  # never started: its checks only
    parsed = MESSAGES.parse(orjson.dumps(body))
    evicting = tuple(spec for spec in LAYERS if spec.name in ("summarize", "trim_head"))
    policy = policies.Policy(summary_role=role, layers=evicting)
    result = await policies.compact(
        parsed.messages,
        policies.Plan(),
        budget=policy.budget(window, None, body["max_tokens"]),
        policy=policy,
        counter=COUNTER,
        fixed_tokens=MESSAGES.fixed_tokens(parsed, COUNTER),
    )
    assert result.plan.cut or result.plan.edits  # something was evicted
    entries = policies.render_entries(parsed.messages, result.plan, summary_role=role)
    for marks in (False, True):
        out = orjson.loads(MESSAGES.render(parsed, entries, marks))
        assert out["messages"][0]["role"] != "system"
        try:
            fake.count(out, headers)
        except AnthropicError as error:
            raise AssertionError(error.message) from None


def test_claude_codes_replayed_turns_keep_their_bytes_but_for_breakpoints() -> None:
    """Each request of Claude Code's recorded loop as the proxy forwards it with its own
    breakpoints: what the turn before forwarded is the start of what the next forwards,
    byte for byte but for the breakpoints (a string system message stays a string)."""
    body = json.loads(RECORDED.read_text())["body"]
    messages = body["messages"]
    ends = [n for n in range(1, len(messages)) if messages[n]["role"] == "assistant"]
    views = []
    for end in [*ends, len(messages)]:
        parsed = MESSAGES.parse(orjson.dumps({**body, "messages": messages[:end]}))
        whole = list(enumerate(parsed.messages))
        views.append(orjson.loads(MESSAGES.render(parsed, whole, True))["messages"])
    assert any("cache_control" in orjson.dumps(v).decode() for v in views)
    for earlier, later in itertools.pairwise(views):
        assert unmarked(later[: len(earlier)]) == unmarked(earlier)
