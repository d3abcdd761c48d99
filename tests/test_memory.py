"""Memory candidates: user preferences, "remember" requests, decisions and facts found by rules
in the messages a compaction evicts, before they are lost, kept in the session (at most 20)
and shown by the admin API."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given

from policies import content_text
from policies.memory import memory_candidates
from tests.conversations import conversations
from tests.harness import harness

CASES = [
    ("I prefer tabs over spaces.", "preference", 0.8),
    ("We really hate long answers!", "preference", 0.8),
    ("I don't want emoji in commit messages.", "preference", 0.8),
    ("Please remember that the staging DB is db-3.", "remember", 0.95),
    ("Don't forget to bump the version.", "remember", 0.95),
    ("Note that prices include VAT.", "remember", 0.95),
    ("Please note the deadline is May 3.", "remember", 0.95),
    ("Never push to main.", "constraint", 0.75),
    ("Let's go with PostgreSQL for storage.", "decision", 0.7),
    ("We decided to ship on Friday.", "decision", 0.7),
    ("My name is Mia.", "fact", 0.6),
    ("I work at Acme in Lyon.", "fact", 0.6),
]
KINDS = {kind for _, kind, _ in CASES}


def user(text: Any) -> dict[str, Any]:
    return {"role": "user", "content": text}


@pytest.mark.parametrize(("text", "kind", "confidence"), CASES)
def test_rules_find_what_to_remember(text: str, kind: str, confidence: float) -> None:
    assert memory_candidates([user(text)]) == [
        {"kind": kind, "text": text, "confidence": confidence, "role": "user"}
    ]


def test_each_sentence_is_a_candidate_once() -> None:
    found = memory_candidates(
        [
            user("Hi there. I prefer short answers. My dog is called Rex! Thanks."),
            {"role": "assistant", "content": "Sure."},
            user("I prefer short answers.\nPlease remember that the build runs at 6."),
        ]
    )
    assert [(c["kind"], c["text"]) for c in found] == [
        ("preference", "I prefer short answers."),
        ("fact", "My dog is called Rex!"),
        ("remember", "Please remember that the build runs at 6."),
    ]


def test_only_user_text_and_assistant_decisions_count() -> None:
    found = memory_candidates(
        [
            {"role": "system", "content": "Remember that you are a helpful assistant."},
            {"role": "developer", "content": "I prefer JSON."},
            {"role": "assistant", "content": "I will use the cache. I prefer tea. My name is Bot."},
            {"role": "tool", "tool_call_id": "c1", "content": "Remember that x is 5."},
            user([{"type": "text", "text": "Remember that my id is 42."}, {"type": "image_url"}]),
        ]
    )
    assert [(c["role"], c["kind"], c["text"]) for c in found] == [
        ("assistant", "decision", "I will use the cache."),
        ("user", "remember", "Remember that my id is 42."),
    ]


@pytest.mark.parametrize(
    "text",
    [
        "Do you remember what I said?",
        "Do I need a visa?",
        "Why do you always do that?",
        "I left a note on the desk.",
        "I remembered my keys.",
        "What time is it?",
        "hello",
        "ok.",
    ],
)
def test_questions_and_chatter_are_not_candidates(text: str) -> None:
    assert memory_candidates([user(text)]) == []


def test_a_candidate_is_at_most_2_kb() -> None:
    for text in ("Remember: " + "记住这个很重要" * 400, "I prefer " + "long " * 1000):
        (found,) = memory_candidates([user(text)])
        assert 0 < len(found["text"].encode()) <= 2048
        assert text.startswith(found["text"])


@given(conversations())
def test_candidates_are_well_formed(messages: list[dict[str, Any]]) -> None:
    said = [content_text(m.get("content")) for m in messages if m["role"] in ("user", "assistant")]
    for candidate in memory_candidates(messages):
        assert set(candidate) == {"kind", "text", "confidence", "role"}
        assert candidate["kind"] in KINDS
        assert 0 <= candidate["confidence"] <= 1
        assert len(candidate["text"].encode()) <= 2048
        assert any(candidate["text"] in text for text in said)


def test_evicted_candidates_are_kept_in_the_session_the_latest_20() -> None:
    filler = "alpha beta gamma delta " * 30
    with harness() as h:
        chat = h.conversation()
        for i in range(45):
            chat.say(f"Please remember that server {i} is web-{i}. {filler}")
        (branch,) = h.state(chat.key).branches
        evicted = branch.plan.cut // 2  # the rounds before the cut: a question and its answer
        assert evicted > 20
        session = h.admin("GET", f"/admin/sessions/{chat.key}").json()
        expected = [f"Please remember that server {i} is web-{i}." for i in range(evicted)]
        assert [m["text"] for m in session["memory"]] == expected[-20:]
        assert {(m["kind"], m["confidence"], m["role"]) for m in session["memory"]} == {
            ("remember", 0.95, "user")
        }
