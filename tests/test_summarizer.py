"""LLM summaries through the proxy, answered by the fake upstream's summarizer hook: rolling
summaries, every way a summary can fail (each degrades to a digest and stores nothing wrong),
retries, the cooldown, and summaries made ahead of time (docs/compaction.md, `summarize`)."""

from __future__ import annotations

import asyncio
import re
import threading
import time
from typing import Any

import httpx
import pytest

from policies.plan import DIGEST_HEADING, SUMMARY_HEADING
from policies.summary import TAIL_HEADING
from proxy.compaction.summarizer import SYSTEM_PROMPT
from tests.conversations import words
from tests.fakes.openai import SUMMARY_PROMPT_PREFIX
from tests.harness import (
    MODEL,
    SESSION_HEADER,
    grow_to_prepare,
    harness,
    header_text,
    history,
    prepare_ahead,
    said,
)

NO_PREPARE = {"prepare_at": 0.85}  # every summary is made on the request path


def test_summaries_roll_each_into_the_next() -> None:
    with harness() as h:
        budget = h.budget()
        chat = h.conversation()
        chat.until("compacted")
        first = h.state(chat.key).branches[0].plan.summary
        assert first is not None and first.kind == "llm" and first.text.startswith("SUMMARY-1:")
        assert header_text(h.forwarded()[-1]) == f"{SUMMARY_HEADING}\n{first.text}"
        chat.until("compacted")
        second = h.state(chat.key).branches[0].plan.summary
        assert second is not None and second.text.startswith("SUMMARY-2:")
        assert header_text(h.forwarded()[-1]) == f"{SUMMARY_HEADING}\n{second.text}"

        one, two = h.summaries.bodies
        assert "Previous summary" not in h.summaries.prompts[0]
        assert f"Previous summary:\n{first.text}" in h.summaries.prompts[1]
        for body in (one, two):
            system = body["messages"][0]
            assert system == {"role": "system", "content": SYSTEM_PROMPT}
            assert system["content"].startswith(SUMMARY_PROMPT_PREFIX)
            assert body["model"] == MODEL and body["temperature"] == 0.1
            assert 0 < body["max_tokens"] <= budget.target_tokens * 0.2
        # The request's own credential, for this task only.
        summaries = [r for r in h.up.requests if r.headers.get("x-compaction-summary") == "1"]
        assert {r.headers["authorization"] for r in summaries} == {"Bearer sk-test"}
        # Only what was evicted is summarised: the newest turns are not in the prompt.
        assert said(chat.turns - 1) not in h.summaries.prompts[1]


def test_a_credential_sent_as_api_key_reaches_the_summarizer() -> None:
    # Azure's clients send their key as `api-key`; the summary carries the same header.
    with harness(policies={"default": NO_PREPARE}) as h:
        response = httpx.post(
            h.url + "/v1/chat/completions",
            json={"model": MODEL, "messages": history(24)},
            headers={"api-key": "azure-key-1", SESSION_HEADER: "azure"},
        )
        assert response.status_code == 200
        assert response.headers["x-compaction-action"] == "compacted"
        (summary,) = [r for r in h.up.requests if r.headers.get("x-compaction-summary") == "1"]
        assert summary.headers["api-key"] == "azure-key-1"
        assert "authorization" not in summary.headers
        assert h.up.requests[-1].headers["api-key"] == "azure-key-1"  # the main call too


FAILURES: dict[str, tuple[Any, float, str]] = {  # the answer, its delay, the metric's outcome
    "error": (lambda n: RuntimeError("boom"), 0.0, "error"),
    "timeout": (lambda n: "SUMMARY: too late", 0.5, "timeout"),
    "empty": (lambda n: None, 0.0, "empty"),
    "blank": (lambda n: "  \n ", 0.0, "empty"),
    "over-long": (lambda n: "OVERLONG " + words(3000, n), 0.0, "overlong"),
}


@pytest.mark.parametrize("failure", FAILURES)
def test_a_failed_summary_degrades_to_a_digest_and_stores_nothing_wrong(failure: str) -> None:
    answer, delay, outcome = FAILURES[failure]
    settings = {"timeout_seconds": 0.25, "retries": 0}
    with harness(policies={"default": {**NO_PREPARE, "summarizer": settings}}) as h:
        h.summaries.answer, h.up.summary_delay = answer, delay
        budget = h.budget()
        chat = h.conversation(rounds=24)
        headers = chat.say()  # over the compaction level at once
        assert headers["x-compaction-action"] == "degraded"
        assert h.up.summary_calls == 1
        assert h.metric("compaction_proxy_summaries_total", outcome=outcome) == 1
        assert int(headers["x-compaction-tokens-after"]) <= budget.target_tokens
        assert chat.usage[-1] <= budget.limit  # served, and it fits
        header = header_text(h.forwarded()[-1])
        assert header.startswith(f"{DIGEST_HEADING}\nUser requests:\n")
        assert "OVERLONG" not in header and "too late" not in header
        (branch,) = h.state(chat.key).branches
        assert branch.plan.summary is not None and branch.plan.summary.kind == "digest"
        assert header == f"{DIGEST_HEADING}\n{branch.plan.summary.text}"


def test_a_failing_summarizer_is_retried() -> None:
    settings = {"retries": 2}
    with harness(policies={"default": {**NO_PREPARE, "summarizer": settings}}) as h:
        h.summaries.answer = lambda n: RuntimeError("boom") if n < 3 else f"SUMMARY-{n}"
        chat = h.conversation(rounds=24)
        assert chat.say()["x-compaction-action"] == "compacted"
        assert h.up.summary_calls == 3
        assert header_text(h.forwarded()[-1]) == f"{SUMMARY_HEADING}\nSUMMARY-3"

        h.summaries.answer = lambda n: RuntimeError("boom")
        other = h.conversation("s2", rounds=24)
        assert other.say()["x-compaction-action"] == "degraded"
        assert h.up.summary_calls == 6  # 1 + 2 retries
        assert h.metric("compaction_proxy_summaries_total", outcome="error") == 5


def test_after_a_failure_the_summarizer_cools_down_then_rolls_the_digest_in() -> None:
    cooldown = 2.5
    settings = {"retries": 0, "cooldown_seconds": cooldown}
    with harness(policies={"default": {**NO_PREPARE, "summarizer": settings}}) as h:
        h.summaries.answer = lambda n: RuntimeError("boom")
        chat = h.conversation(rounds=24)
        failed = time.monotonic()
        assert chat.say()["x-compaction-action"] == "degraded"
        assert h.up.summary_calls == 1
        # Cooling down: compactions degrade at once, without a summary call.
        assert chat.until("degraded")["x-compaction-action"] == "degraded"
        assert h.conversation("s2", rounds=30).say()["x-compaction-action"] == "degraded"
        assert time.monotonic() - failed < cooldown
        assert h.up.summary_calls == 1

        h.summaries.answer = lambda n: f"SUMMARY-{n}: all good again."
        time.sleep(max(0.0, failed + cooldown - time.monotonic()))
        for _ in range(30):
            digest = h.state(chat.key).branches[0].plan.summary
            if chat.say()["x-compaction-action"] == "compacted":
                break
        assert digest is not None and digest.kind == "digest"
        assert f"Previous mechanical digest:\n{digest.text}" in h.summaries.prompts[-1]
        (branch,) = h.state(chat.key).branches
        assert branch.plan.summary is not None
        # Made on the request path, or ahead of time (then followed by a digest of the rest).
        assert branch.plan.summary.text.startswith("SUMMARY-2: all good again.")


def test_a_degraded_compaction_keeps_the_previous_summary_as_it_was() -> None:
    settings = {"retries": 0, "cooldown_seconds": 0.01}
    with harness(policies={"default": {**NO_PREPARE, "summarizer": settings}}) as h:
        # A summarizer that keeps every turn's number it is shown: the facts of the session.
        def facts(n: int) -> str:
            seen = dict.fromkeys(re.findall(r"Turn \d+", h.summaries.prompts[-1]))
            return f"SUMMARY-{n}: " + ", ".join(seen)

        h.summaries.answer = facts
        chat = h.conversation()
        chat.until("compacted")
        first = h.state(chat.key).branches[0].plan.summary
        assert first is not None and first.kind == "llm"
        before = set(re.findall(r"Turn \d+", header_text(h.forwarded()[-1])))

        h.summaries.answer = lambda n: RuntimeError("boom")
        chat.until("degraded")
        header = header_text(h.forwarded()[-1])
        # The summary stays whole (its facts with it); the newly evicted part follows it.
        assert header.startswith(f"{SUMMARY_HEADING}\n{first.text}\n\n{TAIL_HEADING}\n")
        assert before <= set(re.findall(r"Turn \d+", header))
        (branch,) = h.state(chat.key).branches
        summary = branch.plan.summary
        assert summary is not None and summary.text == first.text and summary.tail

        h.summaries.answer = facts
        chat.until("compacted")
        prompt = h.summaries.prompts[-1]
        assert f"Previous summary:\n{first.text}\n\n" in prompt
        assert f"Mechanical digest of the messages after that summary:\n{summary.tail}" in prompt
        (branch,) = h.state(chat.key).branches
        assert branch.plan.summary is not None and branch.plan.summary.tail is None


def released(release: threading.Event, text: str) -> Any:
    """An answer of the fake's summarizer that comes once the test sets `release`."""

    async def answer() -> str:
        await asyncio.to_thread(release.wait)
        return text

    return answer()


def test_a_request_waits_for_its_summary_no_longer_than_its_bound() -> None:
    # The first attempt fails at once; its retry does not answer until the test says so.
    release = threading.Event()
    text = "finished in the background."
    settings = {"request_wait_seconds": 0.3, "timeout_seconds": 20, "retries": 1}
    with harness(policies={"default": {**NO_PREPARE, "summarizer": settings}}) as h:
        h.summaries.answer = lambda n: (
            RuntimeError("boom") if n == 1 else released(release, f"SUMMARY-{n}: {text}")
        )
        chat = h.conversation(rounds=24)
        headers = chat.say()
        # Served with the digest while the retry is still being made.
        assert headers["x-compaction-action"] == "degraded"
        assert h.up.summary_calls == 2 and not release.is_set()
        assert header_text(h.forwarded()[-1]).startswith(DIGEST_HEADING)
        assert h.metric("compaction_proxy_compaction_summaries_total", summary="digest") == 1

        release.set()
        h.wait_for(lambda: h.state(chat.key).branches[0].plan.summary.kind == "llm")
        (branch,) = h.state(chat.key).branches
        assert branch.plan.summary.text == "SUMMARY-2: finished in the background."
        assert h.metric("compaction_proxy_compaction_summaries_total", summary="settled") == 1
        # From the next turn on the summary stands where the digest stood.
        assert chat.say()["x-compaction-action"] == "replayed"
        assert header_text(h.forwarded()[-1]) == f"{SUMMARY_HEADING}\n{branch.plan.summary.text}"
        assert h.up.summary_calls == 2


def test_a_compaction_waits_no_longer_for_a_summary_being_prepared() -> None:
    release = threading.Event()
    settings = {"request_wait_seconds": 0.3, "timeout_seconds": 20}
    with harness(policies={"default": {"summarizer": settings}}) as h:
        h.summaries.answer = lambda n: released(release, f"SUMMARY-{n}: prepared.")
        budget = h.budget()
        chat = h.conversation()
        grow_to_prepare(h, chat)  # its summary is being made, holding the session's lock
        assert h.up.wait_for(lambda: h.up.summary_calls == 1)
        while int((headers := chat.say())["x-compaction-tokens-after"]) < budget.compact_tokens:
            assert headers["x-compaction-action"] == "none"
        # At the compaction level but within the limit: served as it is, without waiting.
        assert int(headers["x-compaction-tokens-after"]) <= budget.limit
        assert headers["x-compaction-action"] == "none" and not release.is_set()
        # Over the limit: compacted now, with the digest, without a second summary call.
        chat.skip(8)
        assert chat.say()["x-compaction-action"] == "degraded"
        assert h.up.summary_calls == 1 and not release.is_set()
        release.set()


# -- ahead of time -----------------------------------------------------------------------------


def test_a_summary_prepared_ahead_of_time_is_used_at_the_next_compaction() -> None:
    with harness() as h:
        chat = h.conversation()
        prepared = prepare_ahead(h, chat)  # asserts it was prepared without a compaction
        assert h.up.summary_calls == 1
        assert h.state(chat.key).branches == ()  # nothing compacted yet
        chat.until("compacted")
        assert h.up.summary_calls == 1  # no summary call on the request path
        header = header_text(h.forwarded()[-1])
        assert header.startswith(f"{SUMMARY_HEADING}\n{prepared.text}")
        (branch,) = h.state(chat.key).branches
        assert branch.plan.summary is not None
        assert header == f"{SUMMARY_HEADING}\n{branch.plan.summary.text}"
        assert h.state(chat.key).prepared is None  # used up

        # The next one is prepared from there and rolls this summary in.
        second = prepare_ahead(h, chat)
        assert second.text == "SUMMARY-2: goals and facts."
        assert f"Previous summary:\n{branch.plan.summary.text}" in h.summaries.prompts[-1]
        chat.until("compacted")
        assert h.up.summary_calls == 2
        assert header_text(h.forwarded()[-1]).startswith(f"{SUMMARY_HEADING}\n{second.text}")


def test_what_lies_past_a_prepared_summary_is_rolled_in_as_a_digest() -> None:
    with harness() as h:
        chat = h.conversation()
        prepared = prepare_ahead(h, chat)
        # The client comes back with many new rounds at once: the cut moves past the
        # prepared part, and what lies between is added as a digest, with no LLM call.
        chat.skip(12)
        assert chat.say()["x-compaction-action"] == "compacted"
        assert h.up.summary_calls == 1
        header = header_text(h.forwarded()[-1])
        assert header.startswith(f"{SUMMARY_HEADING}\n{prepared.text}\n\nUser requests:\n- ")
        (branch,) = h.state(chat.key).branches
        digested = [int(t) for t in re.findall(r"^- Turn (\d+)\b", header, re.MULTILINE)]
        assert digested and min(digested) >= prepared.end // 2  # rounds are 2 messages
        assert max(digested) < branch.plan.cut // 2
