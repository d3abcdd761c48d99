"""Requests recorded from the real agent clients (tests/data/clients, made by `make agents-e2e`):
the strict fakes take each one as the real APIs took them, and the proxy relays each one."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from proxy.config import loads
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
