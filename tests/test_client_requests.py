"""What the proxy forwards of the real clients' requests (tests/data/clients) at small windows:
their own context in every request, no piled-up copies, and their own compaction requests
forwarded with the least loss (the real task kept, no summary prepared for them)."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from proxy.config import loads
from tests.codex import summary_requests
from tests.conversations import unmarked, words
from tests.fakes.anthropic import FakeAnthropic
from tests.fakes.base import RECORDING_KEY
from tests.fakes.openai import FakeUpstream
from tests.servers import ServerThread, proxy_server
from tests.test_client_fixtures import CLIENTS, recorded, send

TASK = "AGENTS-E2E-TASK"
AGENTS_MD = "# AGENTS.md instructions for "
NUDGE = "The user hasn't heard from you in a while."
CLAUDE_PROMPT = "CRITICAL: Respond with TEXT ONLY."
CODEX_PROMPT = "You are performing a CONTEXT CHECKPOINT COMPACTION"


@pytest.fixture
def fakes() -> Iterator[tuple[FakeUpstream, FakeAnthropic]]:
    with (
        FakeUpstream(signing_key=RECORDING_KEY) as openai,
        FakeAnthropic(signing_key=RECORDING_KEY) as anthropic,
    ):
        yield openai, anthropic


def proxy(fakes: tuple[FakeUpstream, FakeAnthropic], **policy: Any) -> ServerThread:
    """The proxy in front of both fakes at the e2e runs' windows (Codex 16k, Claude Code 32k)
    or, with `window`, one window for both; `policy` sets the default policy's levels."""
    openai, anthropic = fakes
    window = policy.pop("window", None)
    config = {
        "upstreams": {
            "openai": {"base_url": f"{openai.origin}/v1"},
            "anthropic": {"base_url": f"{anthropic.origin}/v1", "kind": "anthropic"},
        },
        "default_upstream": {"responses": "openai", "messages": "anthropic"},
        "models": [
            {"match": "gpt-*", "context_window": window or 16384},
            {"match": "claude-*", "context_window": window or 32768},
        ],
        "policies": {"default": policy},
    }
    return proxy_server(loads(yaml.safe_dump(config)))


def with_body(fixture: dict[str, Any], **fields: Any) -> dict[str, Any]:
    changed = copy.deepcopy(fixture)
    changed["body"].update(fields)
    return changed


def texts(body: Any) -> str:
    return json.dumps(body, ensure_ascii=False)


def test_codex_environment_context_is_in_every_forwarded_request(
    fakes: tuple[FakeUpstream, FakeAnthropic],
) -> None:
    """Codex's loop replayed request by request (its recorded items, one round more each
    time) at a 16k window: compacted from the sixth request on, and every forwarded request
    still carries its AGENTS.md and <environment_context> user message, verbatim."""
    fixture = recorded(CLIENTS / "codex-mid-loop.json")
    items = fixture["body"]["input"]
    context = next(i for i in items if AGENTS_MD in texts(i))
    openai, _ = fakes
    actions = []
    with proxy(fakes) as server:
        for end in range(4, len(items) + 1, 3):  # the task, then one round more each time
            answer = send(server.url, with_body(fixture, input=items[:end]))
            assert answer.status_code == 200, answer.text
            actions.append(answer.headers["x-compaction-action"])
    assert "compacted" in actions
    forwarded = [r.json["input"] for r in openai.requests if r not in summary_requests(openai)]
    assert len(forwarded) == len(actions)
    assert all(context in sent for sent in forwarded)


def test_claude_codes_repeated_system_messages_do_not_pile_up(
    fakes: tuple[FakeUpstream, FakeAnthropic],
) -> None:
    """Claude Code repeats a system message word for word inside `messages`; the copies that
    a compaction displaces are left out, not joined at the head (a copy that stays in its
    place, between the rounds kept, stays: the view keeps the client's bytes there; one
    inside the rounds a summary now stands for goes with them)."""
    fixture = recorded(CLIENTS / "claude-mid-loop.json")
    assert texts(fixture["body"]["messages"]).count(NUDGE) == 3
    _, anthropic = fakes
    with proxy(fakes, window=16384) as server:
        answer = send(server.url, fixture)
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-compaction-action"] == "compacted"
    forwarded = anthropic.requests[-1].json["messages"]
    environment = next(m for m in forwarded if "# Environment" in texts(m))
    assert NUDGE not in texts(environment)
    assert texts(forwarded).count(NUDGE) <= 2  # the newest, and one still in its place
    assert texts(forwarded[-1]).count(NUDGE) == 1 and TASK in texts(forwarded)


def test_claude_codes_compaction_request_keeps_its_task_when_compacted(
    fakes: tuple[FakeUpstream, FakeAnthropic],
) -> None:
    """The prompt appended as Claude Code appends it (a text block after the last tool
    result) to a long loop that does not fit: compacted only to the limit, with the task the
    user gave and the prompt kept, and the digest rather than a summary call."""
    loop = recorded(CLIENTS / "claude-mid-loop.json")
    prompt = recorded(CLIENTS / "claude-compaction.json")["body"]["messages"][-1]["content"][-1]
    messages = copy.deepcopy(loop["body"]["messages"][:34])
    messages[-1]["content"].append(prompt)
    fixture = with_body(loop, messages=messages)
    _, anthropic = fakes
    with proxy(fakes, window=14000) as server:
        answer = send(server.url, fixture)
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-compaction-action"] == "compacted"
    forwarded = texts(anthropic.requests[-1].json["messages"])
    assert TASK in forwarded and CLAUDE_PROMPT in forwarded
    assert anthropic.summary_calls == 0
    limit = 14000 - loop["body"]["max_tokens"] - 256
    assert int(answer.headers["x-compaction-tokens-after"]) > 0.7 * limit  # not to the target


def compaction_request(name: str) -> dict[str, Any]:
    """A client's own compaction request: recorded, or Codex's loop with a trigger."""
    if name != "codex-trigger":
        return recorded(CLIENTS / f"{name}.json")
    loop = recorded(CLIENTS / "codex-mid-loop.json")
    return with_body(loop, input=[*loop["body"]["input"], {"type": "compaction_trigger"}])


# Each over `compact_at` but within the window (test_window_sizes_of_the_fixtures_...).
COMPACTION_REQUESTS = {
    # Claude Code's: its prompt appended to the last user turn, after the tool result.
    "claude-compaction": {"window": 16384, "compact_at": 0.45, "prepare_at": 0.4, "target": 0.3},
    # Codex's on a custom provider: an ordinary turn ending in its compaction prompt.
    "codex-compaction": {"compact_at": 0.5, "prepare_at": 0.4, "target": 0.3},
    # Codex's built-in provider: a compaction_trigger item, relayed (`provider_compaction:
    # relay`, the default).
    "codex-trigger": {"window": 65536, "compact_at": 0.5, "prepare_at": 0.4, "target": 0.3},
}


@pytest.mark.parametrize("name", COMPACTION_REQUESTS)
def test_a_clients_own_compaction_request_goes_as_it_came(
    name: str, fakes: tuple[FakeUpstream, FakeAnthropic]
) -> None:
    """The client's own compaction request over `compact_at` but within the window: forwarded
    unchanged (the proxy compacting it would take what the client is summarising), said in
    a header."""
    fixture = compaction_request(name)
    marker = {"claude-compaction": CLAUDE_PROMPT, "codex-compaction": CODEX_PROMPT}
    assert marker.get(name, '"compaction_trigger"') in texts(fixture)
    with proxy(fakes, **COMPACTION_REQUESTS[name]) as server:
        answer = send(server.url, fixture)
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-compaction-action"] == "none"
    assert answer.headers["x-compaction-client-compaction"] == "true"
    fake = fakes[1] if fixture["path"] == "/v1/messages" else fakes[0]
    assert unmarked(fake.requests[-1].json) == unmarked(fixture["body"])


def test_no_summary_is_prepared_for_a_history_the_client_is_replacing(
    fakes: tuple[FakeUpstream, FakeAnthropic],
) -> None:
    """At `prepare_at` the proxy prepares a summary of what its next compaction will evict;
    for the client's own compaction request it does not: the client replaces that history.
    (Claude Code's compaction request, after six earlier rounds of talk.)"""
    fixture = recorded(CLIENTS / "claude-compaction.json")
    earlier = []
    for n in range(6):
        earlier += [
            {"role": "user", "content": f"Question {n}: " + words(300, n)},
            {"role": "assistant", "content": [{"type": "text", "text": words(300, n + 50)}]},
        ]
    asking = with_body(fixture, messages=[*earlier, *fixture["body"]["messages"]])
    ordinary = copy.deepcopy(asking)
    ordinary["body"]["messages"][-1]["content"].pop()  # the same history without the prompt
    _, anthropic = fakes
    with proxy(fakes, window=16384, compact_at=0.95, prepare_at=0.4, target=0.3) as server:
        answer = send(server.url, asking)
        assert answer.headers["x-compaction-client-compaction"] == "true"
        assert answer.headers["x-compaction-action"] == "none"
        assert not anthropic.wait_for(lambda: anthropic.summary_calls > 0, timeout=1.0)
        answer = send(server.url, ordinary)
        assert "x-compaction-client-compaction" not in answer.headers
        assert anthropic.wait_for(lambda: anthropic.summary_calls > 0)


def test_window_sizes_of_the_fixtures_are_what_the_tests_assume(
    fakes: tuple[FakeUpstream, FakeAnthropic],
) -> None:
    """The recorded requests' sizes the windows above are chosen for (tokens as the proxy
    counts them, from its headers)."""
    sizes = {}
    with proxy(fakes, window=1_000_000) as server:
        for name in ("claude-compaction", "codex-compaction", "claude-mid-loop"):
            answer = send(server.url, recorded(CLIENTS / f"{name}.json"))
            sizes[name] = int(answer.headers["x-compaction-tokens-before"])
    assert 0.45 * 12032 < sizes["claude-compaction"] <= 0.6 * 12032  # 16k - 4096 - 256
    assert 0.5 * 12032 < sizes["codex-compaction"] <= 12032
    assert sizes["claude-mid-loop"] > 12032
