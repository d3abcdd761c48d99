"""Long sessions through the proxy: synthetic dialogues and an agent loop, streamed
and not, with anchors configured; and the stability of the forwarded prefix on the recorded
traces against LangChain's trim_messages.

Run with `pytest -s` to see the figures.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from langchain_core.messages import BaseMessage, convert_to_messages, trim_messages
from langchain_core.messages.utils import convert_to_openai_messages

from policies import Message, Policy
from policies.message import visible_text
from policies.plan import SUMMARY_HEADING
from proxy.tools.recordings import client_requests
from tests.conversations import ANCHOR, view_problems, words
from tests.replay import (
    JOIN,
    Turn,
    broken_pairs,
    budget_limit,
    joined,
    lost_anchors,
    prompt_tokens,
    replay,
    replay_servers,
    stability,
    traces_replay,
    upstream_rejection,
)

POLICY = Policy()  # the default policy's levels, fractions of the usable budget
LANGCHAIN_STABLE_SHARE = 0.868  # the share of turns trim_messages keeps stable on held-out traces
ORDERS = [f"ORDER-{1000 + i}" for i in range(6)]


def text(tokens: int, seed: int) -> str:
    """About `tokens` tokens of plain text (words() plants no anchor for seeds 1 mod 3)."""
    return words(tokens * 5 // 6, 3 * seed + 1)


def dialogue(turns: int, user_tokens: int, assistant_tokens: int) -> list[Message]:
    """A chat of `turns` rounds; the first user messages mention the orders (the anchors)."""
    messages: list[Message] = [{"role": "system", "content": "You are a helpful travel agent."}]
    for i in range(turns):
        order = f"About {ORDERS[i]}: " if i < len(ORDERS) else ""
        messages.append({"role": "user", "content": order + text(user_tokens, 2 * i)})
        messages.append({"role": "assistant", "content": text(assistant_tokens, 2 * i + 1)})
    return messages


def agent_loop(iterations: int) -> list[Message]:
    """A task, then `iterations` tool calls whose results are 1.5k-4k tokens; the first
    results name the orders."""
    messages: list[Message] = [
        {"role": "system", "content": "You are a coding agent. Use the tools."},
        {"role": "user", "content": "Fix the failing booking tests. " + text(60, 0)},
    ]
    for i in range(iterations):
        call = {
            "id": f"call_{i}",
            "type": "function",
            "function": {"name": "bash", "arguments": json.dumps({"command": f"pytest -k t{i}"})},
        }
        result = text(1500 + (i * 997) % 2500, i)
        if i < len(ORDERS):
            result = f"{ORDERS[i]} failed.\n{result}"
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
    messages.append({"role": "assistant", "content": "All tests pass now."})
    return messages


def compaction_bound(turns: Sequence[Turn], model: str) -> float:
    """The most compactions to expect: growth / ((compact_at - target) x budget) + 1."""
    growth = turns[-1].tokens_before - turns[0].tokens_before
    return growth / ((POLICY.compact_at - POLICY.target) * budget_limit(model)) + 1


def actions(turns: Sequence[Turn]) -> str:
    return " ".join(t.action or "-" for t in turns)


def check_session(label: str, turns: Sequence[Turn], model: str) -> int:
    """The checks every long session passes; returns its number of compactions."""
    share = stability([[(t.sent, t.view) for t in turns]]).share
    compactions = sum(t.action == "compacted" for t in turns)
    bound = compaction_bound(turns, model)
    print(
        f"\n{label}: {len(turns)} turns, {compactions} compactions (bound {bound:.1f}),"
        f" stable share {share:.1%}, tokens {turns[0].tokens_before}..{turns[-1].tokens_before}"
        f" sent, last forwarded {turns[-1].tokens_after}"
    )
    assert all(t.status == 200 for t in turns)
    assert [r for t in turns for b in t.forwarded if (r := upstream_rejection(b))] == []
    assert broken_pairs(turns) == []
    assert [p for t in turns for p in view_problems(t.sent, t.view or [])] == []
    # Under compact_at nothing is done; then a compaction, replayed until the next one.
    assert re.fullmatch(r"(none )+(compacted( replayed)* ?)+", actions(turns)), actions(turns)
    # Each compaction reaches the target, so the next one waits for at least
    # (compact_at - target) x budget of growth: the bound needs no slack.
    assert all(
        t.tokens_after <= POLICY.target * budget_limit(model)
        for t in turns
        if t.action == "compacted"
    )
    assert compactions <= bound
    # Every view shows the anchors of what was sent (the summarizer keeps none of them).
    assert [a for t in turns for a in lost_anchors(t.sent, t.view or [], ANCHOR)] == []
    assert all("x-compaction-anchors" not in t.headers for t in turns)
    assert all(order in final_text(turns) for order in ORDERS)
    return compactions


def final_text(turns: Sequence[Turn]) -> str:
    return "\n".join(visible_text(m) for m in turns[-1].view or [])


def test_a_70_turn_dialogue_at_8k_streamed() -> None:
    with replay_servers(anchors=[ANCHOR]) as (up, client):
        turns = replay(client, up, dialogue(70, 90, 110), model="gpt-4o-8k", stream=True)
    assert check_session("70-turn dialogue at 8k, streamed", turns, "gpt-4o-8k") >= 2
    assert SUMMARY_HEADING in final_text(turns)
    assert all(t.forwarded[-1]["stream"] is True and t.reply for t in turns)


def test_a_150_turn_dialogue_at_32k_keeps_its_prefix_stable() -> None:
    messages = dialogue(150, 200, 250)
    assert 420 <= prompt_tokens(messages[1:3], "gpt-4o-32k") - 3 <= 480  # ~450 tokens a turn
    with replay_servers(anchors=[ANCHOR]) as (up, client):
        turns = replay(client, up, messages, model="gpt-4o-32k")
    assert check_session("150-turn dialogue at 32k", turns, "gpt-4o-32k") >= 2
    assert SUMMARY_HEADING in final_text(turns)
    assert stability([[(t.sent, t.view) for t in turns]]).share >= 0.95


def test_45_tool_iterations_with_big_results_at_16k_streamed() -> None:
    messages = agent_loop(45)
    with replay_servers(anchors=[ANCHOR]) as (up, client):
        turns = replay(client, up, messages, model="gpt-4o-16k", stream=True)
    assert len(turns) == 46
    assert check_session("45 tool iterations at 16k, streamed", turns, "gpt-4o-16k") >= 2
    # The task message stays, verbatim, to the end; no summary can stand for it, the old
    # tool blocks are cleared and dropped instead.
    assert messages[1] in (turns[-1].view or [])
    # Each iteration adds more than the gap between compact_at and target: compactions go
    # further below, and one that leaves no room for `headroom_turns` more waits for the limit
    # (with the gap alone, 60%; compacting at compact_at, 71% with 13 compactions and 416,048
    # tokens forwarded), with no more tokens forwarded.
    assert stability([[(t.sent, t.view) for t in turns]]).share >= 0.8
    assert sum(t.action == "compacted" for t in turns) <= 9
    assert sum(t.tokens_after for t in turns) <= 416_048


def langchain_views(session: list[Message], model: str) -> list[tuple[Any, Any]]:
    """(sent, kept) for each request of `session` trimmed by LangChain's trim_messages to the
    budget the proxy has, counting tokens as the upstream does."""
    converted = convert_to_messages(session)
    counts: dict[int, int] = {}

    def count(messages: list[BaseMessage]) -> int:
        for m in messages:
            if id(m) not in counts:
                counts[id(m)] = prompt_tokens([convert_to_openai_messages(m)], model) - 3
        return 3 + sum(counts[id(m)] for m in messages)

    views = []
    for history in client_requests(session):
        sent = converted[: len(history)]
        kept = trim_messages(
            sent,
            max_tokens=budget_limit(model),
            token_counter=count,
            strategy="last",
            start_on="human",
            include_system=True,
        )
        views.append((sent, kept))
    return views


def test_on_the_traces_at_8k_the_prefix_is_more_stable_than_with_trim_messages() -> None:
    ours = stability([[(t.sent, t.view) for t in s] for s in traces_replay("gpt-4o-8k", JOIN)])
    theirs = stability([langchain_views(s, "gpt-4o-8k") for s in joined(JOIN)])
    print(
        f"\ntraces at 8k, stable share: ours {ours.share:.1%} of {ours.pairs} turns"
        f" ({ours.trimming_share:.1%} of {ours.trimming_pairs} compacted turns),"
        f" trim_messages {theirs.share:.1%} ({theirs.trimming_share:.1%} of"
        f" {theirs.trimming_pairs} trimmed turns)"
    )
    assert ours.pairs == theirs.pairs
    assert ours.share > LANGCHAIN_STABLE_SHARE
    assert ours.share > theirs.share
    assert ours.trimming_share > theirs.trimming_share
