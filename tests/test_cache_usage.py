"""What the upstream's prompt cache read and wrote, per session, in the admin view: Anthropic's
`cache_read_input_tokens` and `cache_creation_input_tokens` (streamed and not), OpenAI's
`cached_tokens`; kept in the proxy and written with the session's next write, never with a
write of their own."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.config import loads
from proxy.dialects import Usage
from proxy.observability.metrics import Metrics
from proxy.server.app import Proxy
from proxy.sessions.cache_usage import CacheFigures, CacheLedger, CacheUsage
from proxy.sessions.store import MemoryStore
from proxy.upstream.client import UpstreamClient
from tests.conversations import words
from tests.fakes.anthropic import FakeAnthropic
from tests.harness import ADMIN_TOKEN, MODEL, SESSION_HEADER, harness
from tests.servers import proxy_server
from tests.test_exact_count import KEY, SMALL, config

ADMIN = {"authorization": "Bearer admin-token"}


@pytest.fixture(scope="module")
def up() -> Iterator[FakeAnthropic]:
    with FakeAnthropic(windows={SMALL: 8192}) as fake:
        yield fake


def shown(url: str, key: str, token: str = "admin-token") -> httpx.Response:
    return httpx.get(f"{url}/admin/sessions/{key}", headers={"authorization": f"Bearer {token}"})


def test_anthropics_cache_reads_and_writes_are_shown_streamed_and_not(up: FakeAnthropic) -> None:
    system = [{"type": "text", "text": words(1500, 1), "cache_control": {"type": "ephemeral"}}]
    fields: dict[str, Any] = {
        "model": SMALL,
        "max_tokens": 50,
        "system": system,
        "messages": [{"role": "user", "content": "Hello"}],
        "extra_headers": {SESSION_HEADER: "cached"},
    }
    with (
        proxy_server(config(up)) as proxy,
        anthropic.Anthropic(base_url=proxy.url, api_key=KEY, max_retries=0) as client,
    ):
        raw = client.messages.with_raw_response.create(**fields)
        usages = [raw.parse().usage]
        with client.messages.stream(**fields) as stream:
            usages.append(stream.get_final_message().usage)
        session = shown(proxy.url, raw.headers["x-compaction-session"]).json()
    assert usages[0].cache_creation_input_tokens and usages[1].cache_read_input_tokens
    prompts = [
        u.input_tokens + (u.cache_read_input_tokens or 0) + (u.cache_creation_input_tokens or 0)
        for u in usages
    ]
    read = sum(u.cache_read_input_tokens or 0 for u in usages)
    created = sum(u.cache_creation_input_tokens or 0 for u in usages)
    cache = session["prompt_cache"]
    assert cache["total"] == {
        "requests": 2,
        "prompt_tokens": sum(prompts),
        "cache_read_tokens": read,
        "cache_creation_tokens": created,
        "read_share": round(read / sum(prompts), 4),
    }
    last = cache["last"]
    assert last.pop("at") > 0
    assert last == {
        "prompt_tokens": prompts[1],
        "cache_read_tokens": usages[1].cache_read_input_tokens,
        "cache_creation_tokens": usages[1].cache_creation_input_tokens,
        "read_share": round((usages[1].cache_read_input_tokens or 0) / prompts[1], 4),
    }
    assert session["version"] == 0  # nothing was written for them: shown from the proxy


def test_figures_are_written_with_the_sessions_next_write() -> None:
    with harness(replicas=2) as h:
        chat = h.conversation()
        chat.say()
        chat.say()
        assert h.record(chat.key) is None  # no write of their own
        assert h.admin("GET", f"/admin/sessions/{chat.key}").json()["prompt_cache"]["total"][
            "requests"
        ] == (2)
        other = h.servers[1].url  # another replica: nothing stored, nothing read itself
        assert shown(other, chat.key, ADMIN_TOKEN).status_code == 404

        chat.until("compacted")
        # The compaction's write took every answer before the compacting request's.
        stored = h.state(chat.key).prompt_cache
        assert stored is not None
        assert stored.total.requests == chat.turns - 1
        assert stored.total.prompt_tokens == sum(chat.usage[:-1])
        assert shown(other, chat.key, ADMIN_TOKEN).json()["prompt_cache"]["total"][
            "prompt_tokens"
        ] == sum(chat.usage[:-1])
        # The replica that served them adds the one it has not written yet.
        total = h.admin("GET", f"/admin/sessions/{chat.key}").json()["prompt_cache"]["total"]
        assert (total["requests"], total["prompt_tokens"]) == (chat.turns, sum(chat.usage))


def test_openais_cached_tokens_are_shown() -> None:
    with harness() as h:
        client = h.openai()
        items: list[dict[str, Any]] = [{"role": "user", "content": words(1500, 2)}]
        usages = []
        for question in ("First?", "Second?"):
            items.append({"role": "user", "content": question})
            raw = client.responses.with_raw_response.create(
                model=MODEL,
                input=items,  # type: ignore[arg-type]
                prompt_cache_key="shared",
                extra_headers={SESSION_HEADER: "responses"},
            )
            response = raw.parse()
            assert response.usage is not None
            usages.append(response.usage)
            items.append({"role": "assistant", "content": response.output_text})
        key = raw.headers["x-compaction-session"]
        cache = h.admin("GET", f"/admin/sessions/{key}").json()["prompt_cache"]
    cached = [u.input_tokens_details.cached_tokens for u in usages]
    assert cached[1] > 0
    assert cache["last"]["cache_read_tokens"] == cached[1]
    assert cache["total"]["cache_read_tokens"] == sum(cached)
    assert cache["total"]["prompt_tokens"] == sum(u.input_tokens for u in usages)
    assert cache["total"]["cache_creation_tokens"] == 0


counts = st.integers(0, 10**6)
usages = st.builds(Usage, counts, st.none() | counts, st.none() | counts)
steps = st.lists(usages | st.sampled_from(["write starts", "write ends"]), max_size=16)


@given(steps)
def test_what_is_written_and_what_is_not_add_up_to_every_answer(
    steps: list[Usage | str],
) -> None:
    """Whatever answers come, before, during or after a write, the stored figures plus those
    not yet written are every answer's, each once."""
    ledger = CacheLedger()
    stored: CacheUsage | None = None
    writing: CacheUsage | None = None  # what a write in flight carries
    for step in steps:
        if isinstance(step, Usage):
            ledger.observe("k", step)
        elif step == "write starts":
            writing = ledger.unwritten("k")
        elif writing is not None:
            stored = writing.plus(stored)
            ledger.written("k", writing)
            writing = None
    unwritten = ledger.unwritten("k")
    shown = unwritten.plus(stored) if unwritten else stored
    expected = sum(
        (
            CacheFigures(1, u.prompt_tokens, u.cached_tokens or 0, u.cache_creation_tokens or 0)
            for u in steps
            if isinstance(u, Usage)
        ),
        CacheFigures(),
    )
    assert (shown.total if shown else CacheFigures()) == expected
    if shown is not None:
        assert CacheUsage.from_dict(shown.to_dict()) == shown


@given(st.lists(st.sampled_from("abcdefgh"), max_size=40), st.integers(1, 5))
def test_the_ledger_keeps_the_sessions_last_heard_from_up_to_its_bound(
    keys: list[str], bound: int
) -> None:
    ledger = CacheLedger(bound)
    model: dict[str, int] = {}  # the answers heard of each session kept, oldest first
    for i, key in enumerate(keys):
        ledger.observe(key, Usage(1_000 + i, i))
        heard = model.pop(key, 0)
        if len(model) >= bound:
            del model[next(iter(model))]
        model[key] = heard + 1
    assert {k for k in "abcdefgh" if ledger.unwritten(k) is not None} == set(model)
    assert set(model) == set(list(dict.fromkeys(reversed(keys)))[:bound])
    for key, heard in model.items():
        found = ledger.unwritten(key)
        assert found is not None and found.total.requests == heard
        assert found.last.prompt_tokens == 1_000 + len(keys) - 1 - keys[::-1].index(key)


def test_every_per_session_ledger_is_bounded_by_store_max_sessions() -> None:
    config = loads(
        "upstreams: {u: {base_url: 'http://127.0.0.1:1/v1'}}\nstore: {max_sessions: 7}\n"
    )
    metrics = Metrics()
    proxy = Proxy(config, MemoryStore(ttl_seconds=60), UpstreamClient(metrics), metrics)
    exact_counts = proxy.compactor.exact_counts
    assert exact_counts is not None
    bounds = (proxy.cache.max_sessions, proxy.calibration.max_sessions, exact_counts.max_sessions)
    assert bounds == (7, 7, 7)
