"""Shadow mode (docs/config.md, "Shadow mode"): the proxy computes, stores and reports what it
would do, and forwards the client's own bytes."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import orjson
import pytest

from policies.plan import SUMMARY_HEADING
from tests.harness import MODEL, SESSION_HEADER, Harness, harness, history, said

SHADOW_HEADER = "X-Compaction-Shadow"


class RawChat:
    """A client that sends its whole history every turn as bytes of its own formatting (which
    no rendering by the proxy would reproduce), and keeps each body it sent."""

    def __init__(self, h: Harness, session: str = "s1", headers: dict[str, str] | None = None):
        self.h = h
        self.messages: list[dict[str, Any]] = history(0)[:-1]
        self.turns = 0
        self.headers = {SESSION_HEADER: session, "Authorization": "Bearer sk-test"}
        self.headers |= headers or {}
        self.sent: list[bytes] = []

    def say(self, **headers: str) -> httpx.Response:
        self.messages.append({"role": "user", "content": said(self.turns)})
        self.turns += 1
        body = {"model": MODEL, "messages": self.messages, "temperature": 0.5}
        raw = orjson.dumps(body, option=orjson.OPT_INDENT_2)
        self.sent.append(raw)
        response = httpx.post(
            self.h.url + "/v1/chat/completions",
            content=raw,
            headers={**self.headers, **headers, "Content-Type": "application/json"},
        )
        assert response.status_code == 200, response.text
        reply = response.json()["choices"][0]["message"]["content"]
        self.messages.append({"role": "assistant", "content": reply})
        return response

    def until(self, action: str, limit: int = 60) -> httpx.Response:
        for _ in range(limit):
            response = self.say()
            if response.headers["x-compaction-action"] == action:
                return response
        raise AssertionError(f"no {action!r} in {limit} turns")


def chat_bodies(h: Harness) -> list[bytes]:
    """The bodies of the chat requests that reached the upstream (not summaries)."""
    return [
        r.body
        for r in h.up.requests
        if r.path == "/v1/chat/completions" and r.headers.get("x-compaction-summary") != "1"
    ]


def test_a_shadow_policy_forwards_the_client_bytes_and_reports_the_would_be_compaction() -> None:
    with harness(policies={"default": {"shadow": True}}) as h:
        chat = RawChat(h)
        response = chat.until("shadow-compacted")
        headers = response.headers
        key = headers["x-compaction-session"]
        assert headers["x-compaction-shadow"] == "true"
        before, after = (int(headers[f"x-compaction-tokens-{w}"]) for w in ("before", "after"))
        assert after < before

        # Every request went upstream exactly as the client sent it.
        assert chat_bodies(h) == chat.sent
        # The summary was asked for, and the would-be plan stored as a real one would be.
        assert h.summaries.bodies
        (branch,) = h.state(key).branches
        assert branch.plan.cut > 0 and branch.plan.summary is not None
        # The admin view shows the decisions, marked shadow.
        session = h.admin("GET", f"/admin/sessions/{key}").json()
        (decision,) = session["decisions"]
        assert decision["layer"] == "summarize" and decision["shadow"] is True
        assert decision["tokens_after"] == after
        # Metrics: nothing was done; the would-be compaction and its savings are counted.
        assert h.metric("compaction_proxy_compaction_actions_total", action="compacted") == 0
        assert h.metric("compaction_proxy_compaction_actions_total", action="none") == chat.turns
        assert h.metric("compaction_proxy_shadow_actions_total", action="compacted") == 1
        saved = h.metric("compaction_proxy_shadow_tokens_saved_total")
        assert saved >= before - after > 0

        # The next turn replays the would-be plan, in shadow still.
        assert chat.say().headers["x-compaction-action"] == "shadow-replayed"
        assert chat_bodies(h)[-1] == chat.sent[-1]
        # Shadow mode off for a request: the session goes on from the plan it would have had.
        real = chat.say(**{SHADOW_HEADER: "0"})
        assert real.headers["x-compaction-action"] == "replayed"
        assert "x-compaction-shadow" not in real.headers
        forwarded = orjson.loads(chat_bodies(h)[-1])["messages"]
        assert forwarded[1]["content"].startswith(SUMMARY_HEADING)
        assert len(h.summaries.bodies) == h.up.summary_calls  # no summary made again


def test_the_shadow_header_turns_shadow_mode_on_for_one_request() -> None:
    with harness() as h:
        chat = RawChat(h, headers={SHADOW_HEADER: "1"})
        chat.until("shadow-compacted")
        assert chat_bodies(h) == chat.sent
        assert all(r.headers.get(SHADOW_HEADER) is None for r in h.up.requests)  # the proxy's
        assert h.metric("compaction_proxy_shadow_actions_total", action="compacted") == 1
        # Without it, the same session is compacted for real, from the shadow's plan.
        chat.headers.pop(SHADOW_HEADER)
        assert chat.say().headers["x-compaction-action"] == "replayed"
        assert chat_bodies(h)[-1] != chat.sent[-1]


@pytest.mark.parametrize("value", ["yes", "2", ""])
def test_a_bad_shadow_header_is_a_400_in_the_api_shape(value: str) -> None:
    with harness() as h:
        client = openai.OpenAI(base_url=h.url + "/v1", api_key="sk-test", max_retries=0)
        with pytest.raises(openai.BadRequestError) as error:
            client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "Hi"}],
                extra_headers={SHADOW_HEADER: value},
            )
        assert "X-Compaction-Shadow header must be 1" in error.value.message
        assert not chat_bodies(h)


def test_under_shadow_an_upstream_overflow_is_relayed_as_it_is() -> None:
    """The fake's window is twice the proxy's: a history over it is rejected upstream. In
    shadow mode the proxy retries nothing: the client gets the upstream's own answer."""
    with harness(policies={"default": {"shadow": True}}) as h:
        messages = history(70)
        raw = orjson.dumps({"model": MODEL, "messages": messages})
        response = httpx.post(
            h.url + "/v1/chat/completions",
            content=raw,
            headers={SESSION_HEADER: "big", "Authorization": "Bearer sk-test"},
        )
        assert response.status_code == 400
        assert response.json()["error"]["code"] == "context_length_exceeded"
        assert response.headers["x-compaction-action"] == "shadow-compacted"
        assert chat_bodies(h) == [raw]


@pytest.mark.parametrize("shadow", [True, False])
def test_under_shadow_a_would_be_refusal_is_reported_and_the_request_forwarded(
    shadow: bool,
) -> None:
    """One message over the proxy's window (4096) but within the upstream's (8192): the proxy
    refuses it, except under shadow mode, where the upstream judges the client's bytes."""
    with harness() as h:
        raw = orjson.dumps(
            {"model": MODEL, "messages": [{"role": "user", "content": "hello " * 5000}]}
        )
        headers = {SESSION_HEADER: "huge", "Authorization": "Bearer sk-test"}
        response = httpx.post(
            h.url + "/v1/chat/completions",
            content=raw,
            headers={**headers, SHADOW_HEADER: "1" if shadow else "0"},
        )
        refusals = h.metric("compaction_proxy_refusals_total", reason="context_length_exceeded")
        if not shadow:
            assert response.status_code == 400
            assert response.json()["error"]["code"] == "context_length_exceeded"
            assert refusals == 1 and not chat_bodies(h)
            return
        assert response.status_code == 200, response.text
        assert response.headers["x-compaction-action"] == "shadow-refused"
        assert chat_bodies(h) == [raw]
        assert refusals == 0  # nothing was refused
        assert h.metric("compaction_proxy_shadow_actions_total", action="refused") == 1
        assert h.metric("compaction_proxy_compaction_actions_total", action="none") == 1
        key = response.headers["x-compaction-session"]
        decisions = h.admin("GET", f"/admin/sessions/{key}").json()["decisions"]
        assert decisions[-1]["layer"] == "refuse" and decisions[-1]["shadow"] is True
        assert decisions[-1]["detail"] == "context_length_exceeded"
