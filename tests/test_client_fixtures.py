"""Requests recorded from the real agent clients (tests/data/clients, made by `make agents-e2e`):
the strict fakes take each one as the real APIs took them, and the proxy relays each one."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from proxy.config import loads
from proxy.sessions.sessions import session_key
from tests.fakes.anthropic import FakeAnthropic
from tests.fakes.base import RECORDING_KEY
from tests.fakes.openai import FakeUpstream
from tests.servers import ServerThread, proxy_server

CLIENTS = Path(__file__).resolve().parent / "data/clients"
FIXTURES = sorted(CLIENTS.glob("*.json"))
KINDS = {"/v1/responses": "openai", "/v1/messages": "anthropic"}


def recorded(path: Path) -> dict[str, Any]:
    fixture: dict[str, Any] = json.loads(path.read_text())
    return fixture


@pytest.fixture(scope="module")
def fakes() -> Iterator[dict[str, FakeUpstream | FakeAnthropic]]:
    """A fake of each API, with the key of the fakes the requests were recorded against."""
    with (
        FakeUpstream(signing_key=RECORDING_KEY) as openai,
        FakeAnthropic(signing_key=RECORDING_KEY) as anthropic,
    ):
        yield {"openai": openai, "anthropic": anthropic}


@pytest.fixture(scope="module")
def proxy(fakes: dict[str, FakeUpstream | FakeAnthropic]) -> Iterator[ServerThread]:
    """The proxy in front of both fakes, with windows so large that nothing is compacted."""
    config = {
        "upstreams": {
            "openai": {"base_url": f"{fakes['openai'].origin}/v1"},
            "anthropic": {"base_url": f"{fakes['anthropic'].origin}/v1", "kind": "anthropic"},
        },
        "default_upstream": {"responses": "openai", "messages": "anthropic"},
        "models": [{"match": "*", "context_window": 1_000_000}],
    }
    with proxy_server(loads(yaml.safe_dump(config))) as server:
        yield server


def send(origin: str, fixture: dict[str, Any]) -> httpx.Response:
    query = f"?{fixture['query']}" if fixture["query"] else ""
    return httpx.post(
        f"{origin}{fixture['path']}{query}",
        json=fixture["body"],
        headers=fixture["headers"],
        timeout=30,
    )


def test_there_are_fixtures_of_both_clients() -> None:
    names = {path.stem for path in FIXTURES}
    assert {"codex-first", "codex-mid-loop", "claude-first", "claude-mid-loop"} <= names
    assert {"claude-subagent", "claude-compaction"} <= names


@pytest.mark.parametrize("path", FIXTURES, ids=[path.stem for path in FIXTURES])
def test_the_fakes_take_what_the_clients_sent(
    path: Path, fakes: dict[str, FakeUpstream | FakeAnthropic]
) -> None:
    fixture = recorded(path)
    fake = fakes[KINDS[fixture["path"]]]
    fake.reset()
    answer = send(fake.origin, fixture)
    assert answer.status_code == 200, answer.text
    assert b"response.failed" not in answer.content
    assert fake.rejected == 0


@pytest.mark.parametrize("path", FIXTURES, ids=[path.stem for path in FIXTURES])
def test_the_proxy_relays_what_the_clients_sent(
    path: Path, fakes: dict[str, FakeUpstream | FakeAnthropic], proxy: ServerThread
) -> None:
    fixture = recorded(path)
    answer = send(proxy.url, fixture)
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-compaction-action"] == "none"


def session_of(origin: str, fixture: dict[str, Any]) -> str:
    answer = send(origin, fixture)
    assert answer.status_code == 200, answer.text
    return answer.headers["x-compaction-session"]


def test_a_claude_code_sub_agent_is_a_session_of_its_own(proxy: ServerThread) -> None:
    parent, sub = (
        recorded(CLIENTS / "claude-mid-loop.json"),
        recorded(CLIENTS / "claude-subagent.json"),
    )
    session = "X-Claude-Code-Session-Id"
    assert parent["headers"][session] == sub["headers"][session]
    agent = sub["headers"]["x-claude-code-agent-id"]
    tenant = "cred-" + hashlib.sha256(b"sk-agents-e2e").hexdigest()[:24]
    named = sub["headers"][session]
    assert session_of(proxy.url, parent) == session_key(tenant, named)
    assert session_of(proxy.url, sub) == session_key(tenant, f"{named}/agent/{agent}")
    # Sub-agents side by side under one parent: each its own.
    other = {**sub, "headers": {**sub["headers"], "x-claude-code-agent-id": "b2"}}
    assert session_of(proxy.url, other) == session_key(tenant, f"{named}/agent/b2")


def test_a_codex_thread_is_a_session_of_its_own(proxy: ServerThread) -> None:
    parent = recorded(CLIENTS / "codex-mid-loop.json")
    tenant = "cred-" + hashlib.sha256(b"sk-agents-e2e").hexdigest()[:24]
    thread = parent["headers"]["thread-id"]
    assert session_of(proxy.url, parent) == session_key(tenant, thread)
    # A sub-agent's thread: its parent's session-id, its own thread-id and prompt_cache_key.
    child = "01a21d6e-0000-7000-8000-00000000c41d"
    headers = {**parent["headers"], "thread-id": child}
    body = {**parent["body"], "prompt_cache_key": child}
    assert session_of(proxy.url, {**parent, "headers": headers, "body": body}) == session_key(
        tenant, child
    )
    # The session alone, as Codex sends it (`session-id`) or sent it (`session_id`).
    body = {k: v for k, v in parent["body"].items() if k != "prompt_cache_key"}
    bare = {k: v for k, v in parent["headers"].items() if k not in ("thread-id", "session-id")}
    for name in ("session-id", "session_id"):
        alone = {**parent, "headers": {**bare, name: "codex-session"}, "body": body}
        assert session_of(proxy.url, alone) == session_key(tenant, "codex-session")
