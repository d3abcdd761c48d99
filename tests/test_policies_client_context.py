"""The clients' own context and compaction prompts (policies/client_context.py): recognised in
the requests the real clients sent (tests/data/clients), kept in every view, superseded copies
left out where a compaction displaced them, and the task never taken for what it is not."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies import Plan, Policy, compact, current_turn, outside_chain, render
from policies.client_context import (
    context_kinds,
    fragment_kind,
    is_compaction_prompt,
    is_compaction_request,
)
from proxy.dialects import Messages, Responses
from tests.conftest import examples
from tests.conversations import CharCounter, budget_for, conversations, view_problems

CLIENTS = Path(__file__).resolve().parent / "data/clients"
COUNTER = CharCounter()
HEALTH = [HealthCheck.too_slow, HealthCheck.data_too_large]
# Codex's local compaction prompt, as it begins (openai/codex,
# codex-rs/core/templates/compact/prompt.md, Apache-2.0).
CODEX_COMPACTION = "You are performing a CONTEXT CHECKPOINT COMPACTION. Create a handoff summary"


def canonical(name: str) -> list[dict[str, Any]]:
    """The canonical messages of a recorded request, as the proxy reads it."""
    fixture = json.loads((CLIENTS / f"{name}.json").read_text())
    dialect = Responses() if fixture["path"] == "/v1/responses" else Messages()
    return dialect.parse(json.dumps(fixture["body"]).encode()).messages


def env_context(cwd: str) -> dict[str, Any]:
    """A user message as Codex sends its environment context when it changes."""
    text = (
        f"<environment_context>\n  <cwd>{cwd}</cwd>\n  <shell>bash</shell>\n</environment_context>"
    )
    return {"role": "user", "content": [{"type": "text", "text": text}]}


def test_codex_context_is_recognised_in_what_codex_sent() -> None:
    messages = canonical("codex-first")
    kinds = [context_kinds(m) for m in messages]
    assert kinds[2] == {"agents_md", "environment_context"}  # AGENTS.md and the environment
    assert kinds[3] is None  # the task
    assert [outside_chain(m) for m in messages] == [True, True, True, False]
    assert current_turn(messages) == [3]


def test_claude_code_reminders_beside_the_task_leave_it_the_task() -> None:
    messages = canonical("claude-first")
    assert context_kinds(messages[0]) is None  # two reminders and the task: the task
    reminders = [p["text"] for p in messages[0]["content"][:2]]
    assert [fragment_kind(t) for t in reminders] == ["claude_md", "attribution"]
    assert current_turn(messages) == [0]


def test_a_reminder_alone_after_tool_results_is_not_the_task() -> None:
    """Claude Code may put a reminder beside a turn's tool results: the task stays the one
    the user gave, and the loop's newest tool block is still the turn."""
    messages = canonical("claude-mid-loop")
    reminder = {
        "role": "user",
        "content": [{"type": "text", "text": "<system-reminder>\nx\n</system-reminder>"}],
    }
    with_reminder = [*messages, reminder]
    chain = [i for i, m in enumerate(with_reminder) if not outside_chain(m)]
    turn = current_turn(with_reminder)
    assert turn[0] == 0  # the task
    assert with_reminder[turn[-1]]["role"] == "tool"
    assert len(with_reminder) - 1 not in chain


def test_the_clients_compaction_prompts_are_not_the_task() -> None:
    messages = canonical("claude-compaction")
    assert is_compaction_request(messages) and is_compaction_prompt(messages[-1])
    turn = current_turn(messages)
    assert turn[0] == 0  # the real task, then the tool block and the prompt
    assert turn[-1] == len(messages) - 1
    codex = [*canonical("codex-mid-loop"), {"role": "user", "content": CODEX_COMPACTION}]
    assert is_compaction_request(codex)
    assert current_turn(codex)[0] == 3  # the task, not the prompt
    assert not is_compaction_request(canonical("codex-mid-loop"))


async def test_codex_context_stays_in_a_compacted_view_and_superseded_copies_go() -> None:
    """Codex's loop at a small window: its AGENTS.md and environment context are in the view
    whatever is dropped; an environment context re-sent later replaces an evicted earlier one."""
    messages = canonical("codex-mid-loop")
    old, new = env_context("/tmp/old"), env_context("/tmp/new")
    messages = [*messages[:10], old, *messages[10:20], new, *messages[20:]]
    result = await compact(
        messages, Plan(), budget=budget_for(8192), policy=Policy(), counter=COUNTER
    )
    assert result.decisions  # something was taken out
    assert messages[2] in result.view  # AGENTS.md and the first environment context
    assert new in result.view
    assert old not in result.view  # displaced and superseded by `new`
    assert view_problems(messages, result.view) == []
    assert result.tokens_after == sum(COUNTER.message(m) for m in result.view)


async def test_identical_system_messages_do_not_pile_up() -> None:
    """Claude Code repeats a system message word for word: the copies a compaction displaces
    are left out, the newest stays."""
    messages = canonical("claude-mid-loop")
    nudges = [i for i, m in enumerate(messages) if m["role"] == "system" and i > 1]
    assert len(nudges) == 3
    result = await compact(
        messages, Plan(), budget=budget_for(8192), policy=Policy(), counter=COUNTER
    )
    shown = [m for m in result.view if m["role"] == "system"]
    assert shown.count(messages[nudges[-1]]) == 1
    assert messages[1] in shown  # the environment and CLAUDE.md
    assert view_problems(messages, result.view) == []


@settings(max_examples=examples(150), deadline=None, suppress_health_check=HEALTH)
@given(
    messages=conversations(),
    data=st.data(),
)
async def test_the_newest_copy_of_each_kind_of_context_is_in_every_view(
    messages: list[dict[str, Any]], data: st.DataObject
) -> None:
    """Wherever the client's context messages stand and whatever the compaction removes, the
    view shows the newest of each kind verbatim, and the next turn's view begins with it."""
    for _ in range(data.draw(st.integers(1, 4))):
        # Where the client puts it: anywhere but inside a tool block.
        places = [
            i
            for i in range(len(messages) + 1)
            if i == len(messages) or messages[i]["role"] != "tool"
        ]
        at = data.draw(st.sampled_from(places))
        cwd = data.draw(st.sampled_from(["/a", "/b"]))
        messages = [*messages[:at], env_context(cwd), *messages[at:]]
    window = data.draw(st.sampled_from([1024, 2048, 4096]))
    result = await compact(
        messages, Plan(), budget=budget_for(window), policy=Policy(), counter=COUNTER
    )
    newest = next(m for m in reversed(messages) if context_kinds(m))
    assert any(m is newest for m in result.view)
    assert view_problems(messages, result.view) == []
    assert result.tokens_after == sum(COUNTER.message(m) for m in result.view)
    later = [*messages, {"role": "user", "content": "and then?"}]
    assert render(later, result.plan)[: len(result.view)] == result.view
