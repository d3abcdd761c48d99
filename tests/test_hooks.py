"""Compaction hooks (docs/config.md, `hooks`): a real hook server on loopback is asked before
each summary and told each compaction's outcome; a hook that is slow, fails or is down never
fails a request."""

from __future__ import annotations

import base64
import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import policies
from tests.fakes.hook import FakeHook, closed_port_url
from tests.harness import Harness, harness, prepare_ahead
from tests.test_summarizer import NO_PREPARE, released

PRE, POST = "/pre-compact", "/post-compact"
INSTRUCTIONS = "Keep every ticket id verbatim."
CONFIG_DOC = Path(__file__).parent.parent / "docs" / "config.md"
ADDED = f"Additional instructions for this summary:\n{INSTRUCTIONS}"


@contextlib.contextmanager
def hooked(hooks: dict[str, dict[str, Any]], **sections: Any) -> Iterator[tuple[Harness, FakeHook]]:
    """A harness with these `hooks` (a `url` that is a path: that path of the fake hook) and
    config `sections`."""
    with FakeHook() as hook:
        settings = {
            name: {**given, "url": hook.url(url) if (url := given["url"]).startswith("/") else url}
            for name, given in hooks.items()
        }
        with harness(hooks=settings, **sections) as h:
            yield h, hook


def documented(field: str) -> bool:
    """Whether the `hooks` section of docs/config.md names this payload field."""
    section = CONFIG_DOC.read_text().split("## `hooks`", 1)[1].split("\n## ", 1)[0]
    return f"`{field}`" in section


def outcomes(h: Harness, hook: str, outcome: str) -> float:
    return h.metric("compaction_proxy_hook_calls_total", hook=hook, outcome=outcome)


def test_pre_compact_instructions_reach_every_summary_request() -> None:
    with hooked({"pre_compact": {"url": PRE}}) as (h, hook):
        hook.answer = {"instructions": INSTRUCTIONS}
        chat = h.conversation()
        chat.until("compacted")
        calls = hook.calls(PRE)
        # Asked before each summary, ahead of time or on the request path, and only then.
        assert calls and len(calls) == len(h.summaries.bodies) == h.up.summary_calls
        assert all(ADDED in prompt for prompt in h.summaries.prompts)
        call = calls[-1]
        assert call["hook"] == "pre_compact" and call["session"] == chat.key
        assert (call["policy"], call["api"], call["model"]) == ("default", "chat", chat.model)
        assert call["layers"] == [spec.name for spec in policies.DEFAULT_LAYERS]
        assert call["shadow"] is False and isinstance(call["ahead"], bool)
        summary = call["summary"]
        assert 0 <= summary["start"] < summary["end"] and summary["messages"] > 0
        assert summary["max_tokens"] > 0
        # No message text unless the hook asks for it.
        assert set(summary) == {"start", "end", "messages", "max_tokens", "previous"}
        assert all(b"Turn " not in r.body for r in hook.requests)
        assert outcomes(h, "pre_compact", "ok") == len(calls)


def test_a_hooks_url_credentials_and_headers_go_with_each_call() -> None:
    """A user and password in the URL go as Basic credentials (docs/config.md), the hook's
    headers as set, and the body's type once, whatever the hook's headers say."""
    with FakeHook() as hook:
        url = hook.url(PRE).replace("http://", "http://hook%20user:s%40cret@")
        headers = {"X-Token": "t1", "content-type": "text/plain"}
        pre = {"url": url, "headers": headers}
        with harness(hooks={"pre_compact": pre}) as h:
            hook.answer = {"instructions": INSTRUCTIONS}
            h.conversation().until("compacted")
            assert hook.calls(PRE)
            for call in hook.requests:
                basic = base64.b64encode(b"hook user:s@cret").decode()
                assert call.headers["Authorization"] == f"Basic {basic}"
                assert call.headers["X-Token"] == "t1"
                assert call.headers.getall("Content-Type") == ["application/json"]


def test_hooks_at_one_url_each_send_their_own_headers() -> None:
    with FakeHook() as hook:
        pre = {"url": hook.url(PRE), "headers": {"X-Event": "pre"}}
        post = {"url": hook.url(PRE), "headers": {"X-Event": "post"}}
        with harness(hooks={"pre_compact": pre, "post_compact": post}) as h:
            h.conversation().until("compacted")
            h.wait_for(lambda: len({call.json["hook"] for call in hook.requests}) == 2)
            for call in hook.requests:
                assert call.headers["X-Event"] == call.json["hook"].removesuffix("_compact")


def test_admin_instructions_come_first_then_the_hooks() -> None:
    with hooked({"pre_compact": {"url": PRE, "include_text": True}}) as (h, hook):
        hook.answer = {"instructions": INSTRUCTIONS}
        chat = h.conversation()
        prepare_ahead(h, chat)
        assert hook.calls(PRE)[-1]["ahead"] is True
        own = "Keep every server name verbatim."
        h.admin("POST", f"/admin/sessions/{chat.key}/compact", json={"instructions": own})
        chat.skip(6)  # past what the prepared summary covers
        assert chat.say()["x-compaction-action"] == "compacted"
        assert hook.calls(PRE)[-1]["ahead"] is False
        assert (
            f"Additional instructions for this summary:\n{own}\n\n{INSTRUCTIONS}"
            in (h.summaries.prompts[-1])
        )
        # With include_text, the hook sees what is summarised and the instructions given.
        summary = hook.calls(PRE)[-1]["summary"]
        assert summary["instructions"] == own
        assert summary["evicted"][0]["content"].startswith("Turn 0:")
        assert len(summary["evicted"]) == summary["messages"]
        # docs/config.md names each field that include_text adds.
        added = set(summary) - {"start", "end", "messages", "max_tokens", "previous"}
        assert added == {"evicted", "previous_text", "instructions"}
        assert all(documented(f"summary.{field}") for field in added)


@pytest.mark.parametrize(
    ("behaviour", "outcome"),
    [
        ({"delay": 5.0}, "timeout"),
        ({"status": 500, "answer": {"instructions": INSTRUCTIONS}}, "error"),
        ({"answer": {"instructions": 42}}, "error"),
        ({"answer": ["not", "an", "object"]}, "error"),
        # Larger than any hook's answer the proxy reads (64 KiB): not read whole.
        ({"answer": {"instructions": INSTRUCTIONS, "padding": "p" * 100_000}}, "error"),
    ],
)
def test_a_failing_pre_compact_hook_is_left_out(behaviour: dict[str, Any], outcome: str) -> None:
    with hooked({"pre_compact": {"url": PRE, "timeout_seconds": 0.2}}) as (h, hook):
        for name, value in behaviour.items():
            setattr(hook, name, value)
        chat = h.conversation()
        headers = chat.until("compacted")
        assert int(headers["x-compaction-tokens-after"]) < int(
            headers["x-compaction-tokens-before"]
        )
        # The summaries were made all the same, without the hook's instructions.
        assert h.summaries.bodies and not any(ADDED in p for p in h.summaries.prompts)
        assert outcomes(h, "pre_compact", outcome) == len(hook.calls(PRE)) > 0
        assert outcomes(h, "pre_compact", "ok") == 0


def test_hooks_that_are_down_never_fail_a_request() -> None:
    down = {
        "pre_compact": {"url": closed_port_url(PRE)},
        "post_compact": {"url": closed_port_url(POST)},
    }
    with hooked(down) as (h, _):
        chat = h.conversation()
        chat.until("compacted")
        assert chat.say()["x-compaction-action"] == "replayed"
        assert outcomes(h, "pre_compact", "error") >= 1
        h.wait_for(lambda: outcomes(h, "post_compact", "error") >= 1)
        assert h.summaries.bodies  # the summaries were made without the hook


def test_post_compact_is_told_the_outcome_without_text() -> None:
    with hooked({"post_compact": {"url": POST}}) as (h, hook):
        chat = h.conversation()
        chat.say("Please note ticket ORD-1234 for later.")
        headers = chat.until("compacted")
        hook.wait_for(lambda: len(hook.calls(POST)) == 1)
        (call,) = hook.calls(POST)
        assert call["hook"] == "post_compact" and call["session"] == chat.key
        assert (call["action"], call["reactive"], call["shadow"]) == ("compacted", False, False)
        tokens = call["tokens"]
        assert tokens["before"] == int(headers["x-compaction-tokens-before"])
        assert tokens["after"] == int(headers["x-compaction-tokens-after"])
        assert tokens["after"] <= tokens["compact_at"] <= tokens["limit"]
        assert [d["layer"] for d in call["decisions"]] == ["summarize"]
        plan = h.state(chat.key).branches[0].plan
        assert call["summary"] == {
            "kind": "llm",
            "covers": plan.cut,
            "tokens": call["summary"]["tokens"],
        }
        assert call["summary"]["tokens"] > 0
        assert call["anchors"]["complete"] is True and "text" not in call["anchors"]
        assert not any(text in hook.requests[0].body for text in (b"Turn ", b"SUMMARY-", b"ORD-"))
        h.wait_for(lambda: outcomes(h, "post_compact", "ok") == 1)


def test_post_compact_with_text_gets_the_summary_and_the_anchors() -> None:
    anchors = {"default": {"anchors": [r"ORD-\d+"]}}
    with hooked({"post_compact": {"url": POST, "include_text": True}}, policies=anchors) as (
        h,
        hook,
    ):
        chat = h.conversation()
        chat.say("Please note ticket ORD-1234 for later.")
        chat.until("compacted")
        hook.wait_for(lambda: len(hook.calls(POST)) == 1)
        (call,) = hook.calls(POST)
        plan = h.state(chat.key).branches[0].plan
        assert plan.summary is not None
        assert call["summary"]["text"] == plan.summary.shown
        assert call["summary"]["text"].startswith("SUMMARY-")
        assert call["anchors"] == {"kept": 1, "complete": True, "text": "ORD-1234"}
        assert plan.anchor_block == "ORD-1234"
        texts = [f"{part}.{field}" for part in ("summary", "anchors") for field in call[part]]
        assert all(documented(t) for t in texts if t.endswith(".text"))
        assert {"summary.text", "anchors.text"} <= set(texts)


def test_post_compact_calls_past_max_in_flight_are_dropped() -> None:
    # The hook holds its first call far longer than the test: the next one finds no room.
    settings = {"url": POST, "timeout_seconds": 60, "max_in_flight": 1}
    with hooked({"post_compact": settings}) as (h, hook):
        hook.delay = 60.0
        chat = h.conversation()
        chat.until("compacted")
        hook.wait_for(lambda: len(hook.calls(POST)) == 1)
        h.admin("POST", f"/admin/sessions/{chat.key}/compact")
        assert chat.say()["x-compaction-action"] == "compacted"
        assert outcomes(h, "post_compact", "dropped") == 1
        assert len(hook.calls(POST)) == 1


def test_post_compact_is_told_when_a_late_summary_takes_the_digests_place() -> None:
    release = threading.Event()
    waits = {"request_wait_seconds": 0.3, "timeout_seconds": 20, "retries": 0}
    policy = {"default": {"prepare_at": 0.9, "summarizer": waits}}
    with hooked({"post_compact": {"url": POST}}, policies=policy) as (h, hook):
        h.summaries.answer = lambda n: released(release, f"SUMMARY-{n}: late.")
        chat = h.conversation(rounds=24)
        assert chat.say()["x-compaction-action"] == "degraded"
        hook.wait_for(lambda: len(hook.calls(POST)) == 1)
        release.set()
        hook.wait_for(lambda: len(hook.calls(POST)) == 2)
        degraded, settled = hook.calls(POST)
        assert (degraded["action"], degraded["summary"]["kind"]) == ("degraded", "digest")
        assert (settled["action"], settled["summary"]["kind"]) == ("settled", "llm")
        assert settled["session"] == degraded["session"] == chat.key


def test_pre_compact_is_not_asked_while_the_summarizer_cools_down() -> None:
    """No summary will be requested: the hook's instructions would go unused, and the request
    would wait for them."""
    cooling = {"default": {**NO_PREPARE, "summarizer": {"retries": 0, "cooldown_seconds": 600}}}
    with hooked({"pre_compact": {"url": PRE}}, policies=cooling) as (h, hook):
        h.summaries.answer = lambda n: RuntimeError("boom")
        assert h.conversation(rounds=24).say()["x-compaction-action"] == "degraded"
        assert len(hook.calls(PRE)) == h.up.summary_calls == 1
        # Cooling down: the next compaction degrades at once, neither hook nor summary asked.
        assert h.conversation("s2", rounds=24).say()["x-compaction-action"] == "degraded"
        assert len(hook.calls(PRE)) == h.up.summary_calls == 1
        assert h.metric("compaction_proxy_summaries_total", outcome="cooling_down") == 1
