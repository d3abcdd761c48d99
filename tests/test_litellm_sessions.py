"""Compaction through upstreams of kind litellm: long sessions at an 8k window, summaries
written by a provider through litellm, the reactive retry on a provider's window error, and
the prompt cache marks on Anthropic routes."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from policies.plan import SUMMARY_HEADING
from tests.conftest import metric
from tests.conversations import words
from tests.fakes.openai import SUMMARY_PROMPT_PREFIX
from tests.litellm_fakes import (
    CLAUDE,
    GEMINI,
    WINDOW,
    Providers,
    fixtures,
    providers,
)

pytestmark = pytest.mark.litellm

shared, p = fixtures()


def say(client: openai.OpenAI, model: str, messages: list[Any], session: str) -> httpx.Headers:
    """One turn: the whole history sent, the answer appended; the response headers."""
    raw = client.chat.completions.with_raw_response.create(
        model=model, messages=messages, extra_headers={"X-Session-Id": session}
    )
    messages.append({"role": "assistant", "content": raw.parse().choices[0].message.content})
    return raw.headers


def session(
    p: Providers, model: str, turns: int, size: int = 230, name: str = "long"
) -> list[httpx.Headers]:
    """`turns` user turns of about `size` words each, every one answered (never rejected)."""
    client = p.client()
    messages: list[Any] = [{"role": "system", "content": "You are a terse assistant."}]
    answers = []
    for turn in range(turns):
        messages.append({"role": "user", "content": f"Turn {turn}: {words(size, turn)}"})
        answers.append(say(client, model, messages, f"{name}-{model}"))
    return answers


def anthropic_bodies(p: Providers) -> list[dict[str, Any]]:
    return [r.json for r in p.anthropic.requests if r.path == "/v1/messages"]


def is_summary(body: dict[str, Any]) -> bool:
    system = body.get("system")
    text = system if isinstance(system, str) else "".join(b["text"] for b in system or [])
    return text.startswith(SUMMARY_PROMPT_PREFIX)


@pytest.mark.parametrize("model", [CLAUDE, GEMINI])
def test_thirty_turns_at_an_8k_window_compact_with_no_rejection(p: Providers, model: str) -> None:
    answers = session(p, model, 30)
    actions = [h["x-compaction-action"] for h in answers]
    assert "compacted" in actions and "degraded" not in actions
    # The provider never saw more than its window: the strict fakes would have refused.
    assert max(int(h["x-compaction-tokens-after"]) for h in answers) < WINDOW
    # The summaries were written by the same provider, through litellm.
    if model == CLAUDE:
        summaries = [b for b in anthropic_bodies(p) if is_summary(b)]
        chats = [b for b in anthropic_bodies(p) if not is_summary(b)]
        assert summaries and len(chats) == 30
        header = next(
            m for m in chats[-1]["messages"] if SUMMARY_HEADING in json.dumps(m["content"])
        )
        assert "Summary of" in json.dumps(header)
    else:
        systems = [json.dumps(r.json.get("system_instruction")) for r in p.gemini.requests]
        assert any(SUMMARY_PROMPT_PREFIX in s for s in systems)
        last = p.gemini.requests[-1].json["contents"]
        assert SUMMARY_HEADING in json.dumps(last) and "Summary of" in json.dumps(last)


def test_a_summarizer_upstream_of_kind_litellm(p: Providers) -> None:
    """Chats on Anthropic, summaries by Gemini: both through litellm."""
    with providers(
        policies={"default": {"summarizer": {"upstream": "gemini", "model": GEMINI}}}
    ) as other:
        answers = session(other, CLAUDE, 24)
        assert "compacted" in [h["x-compaction-action"] for h in answers]
        assert not any(is_summary(b) for b in anthropic_bodies(other))
        systems = [json.dumps(r.json.get("system_instruction")) for r in other.gemini.requests]
        assert systems and all(SUMMARY_PROMPT_PREFIX in s for s in systems)
        assert "Summary of" in json.dumps(anthropic_bodies(other)[-1]["messages"])


def test_a_window_error_of_the_provider_is_retried_compacted(p: Providers) -> None:
    """The proxy believes in a 32k window, the provider has 8k: its error (litellm's
    ContextWindowExceededError) makes the proxy compact harder and retry, unseen."""
    with providers(
        models=[{"match": "claude-*", "upstream": "claude", "context_window": 32_768}]
    ) as other:
        client = other.client()
        messages: list[Any] = [{"role": "system", "content": "Be terse."}]
        for turn in range(14):
            messages += [
                {"role": "user", "content": f"Turn {turn}: {words(500, turn)}"},
                {"role": "assistant", "content": "Noted."},
            ]
        messages.append({"role": "user", "content": "And now?"})
        raw = client.chat.completions.with_raw_response.create(model=CLAUDE, messages=messages)
        assert raw.parse().choices[0].message.content
        assert raw.headers["x-compaction-action"] in ("compacted", "degraded")
        chats = [b for b in anthropic_bodies(other) if not is_summary(b)]
        assert len(chats) == 2  # refused once, then accepted compacted
        assert len(chats[1]["messages"]) < len(chats[0]["messages"])


def test_the_stable_prefix_is_marked_for_anthropics_prompt_cache(p: Providers) -> None:
    answers = session(p, CLAUDE, 4, size=500, name="cached")
    assert all(h["x-compaction-action"] == "none" for h in answers)
    bodies = anthropic_bodies(p)
    for body in bodies[1:]:
        marked = [m for m in body["messages"] if "cache_control" in json.dumps(m)]
        assert [m["role"] for m in marked] == ["assistant"]  # the last replayed message
        assert marked[0] is [m for m in body["messages"] if m["role"] == "assistant"][-1]
    with httpx.Client() as http:
        cached = metric(
            http, p.proxy, "compaction_proxy_cached_prompt_tokens_total", dialect="chat"
        )
        prompt = metric(
            http, p.proxy, "compaction_proxy_upstream_prompt_tokens_total", dialect="chat"
        )
    assert 0 < cached < prompt


def test_prompt_cache_marks_can_be_turned_off(p: Providers) -> None:
    with providers(upstreams={"claude": {"prompt_cache": False}}) as other:
        session(other, CLAUDE, 3, size=500, name="uncached")
        assert "cache_control" not in json.dumps(anthropic_bodies(other))
