"""The mechanical digest: its sections, its cap, and how it rolls an earlier digest in."""

from __future__ import annotations

import json

from policies import digest
from policies.digest import telling
from tests.conversations import CharCounter

COUNTER = CharCounter()

EVICTED = [
    {"role": "user", "content": "Please book flight HAT123 for Mia.\nI prefer aisle seats."},
    {
        "role": "assistant",
        "content": "I will book HAT123 now. Next step: confirm the payment.",
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {
                    "name": "book",
                    "arguments": json.dumps(
                        {"flight": "HAT123", "passengers": ["Mia"], "note": "x" * 60}
                    ),
                },
            }
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "{}\nError: payment failed (card 7447)"},
    {"role": "assistant", "content": "The payment failed.\nWhich card should I use?"},
]


def test_digest_has_one_section_per_kind_of_item() -> None:
    assert digest(None, EVICTED, max_tokens=500, counter=COUNTER) == "\n".join(
        [
            "User requests:",
            "- Please book flight HAT123 for Mia.",
            "- I prefer aisle seats.",
            "Decisions:",
            "- I will book HAT123 now.",
            "Tool calls:",
            '- book(flight=HAT123, passengers=["Mia"], note=' + "x" * 40 + "…)",
            "Errors:",
            "- book: Error: payment failed (card 7447)",
            "Open items:",
            "- Next step: confirm the payment.",
            "- asked: Which card should I use?",
        ]
    )


def test_digest_keeps_the_newest_items_that_fit_its_cap() -> None:
    evicted = [{"role": "user", "content": f"request number {i}"} for i in range(100)]
    text = digest(None, evicted, max_tokens=60, counter=COUNTER)
    assert COUNTER.text(text) <= 60
    lines = text.splitlines()
    assert lines[0] == "User requests:"
    assert lines[-1] == "- request number 99"
    assert lines[1:] == [f"- request number {i}" for i in range(100 - len(lines) + 1, 100)]


def test_digest_shortens_long_items() -> None:
    evicted = [{"role": "user", "content": "word " * 500}]
    (line,) = digest(None, evicted, max_tokens=500, counter=COUNTER).splitlines()[1:]
    assert line.endswith("…") and COUNTER.text(line) <= 62


def test_a_previous_digest_is_extended() -> None:
    first = digest(None, EVICTED, max_tokens=500, counter=COUNTER)
    more = [{"role": "user", "content": "Also add insurance."}]
    rolled = digest(first, more, max_tokens=500, counter=COUNTER)
    assert rolled.splitlines()[:4] == [
        "User requests:",
        "- Please book flight HAT123 for Mia.",
        "- I prefer aisle seats.",
        "- Also add insurance.",
    ]
    assert "- book: Error: payment failed (card 7447)" in rolled.splitlines()


def test_an_earlier_summary_block_of_an_older_digest_is_not_taken_for_items() -> None:
    older = "Earlier summary:\n- Goal: a trip\nUser requests:\n- Add insurance."
    rolled = digest(older, [], max_tokens=300, counter=COUNTER)
    assert rolled == "User requests:\n- Add insurance."


def test_what_the_user_said_comes_before_chatter_and_tool_noise() -> None:
    evicted = [
        {"role": "user", "content": "Hi there, hope you are well. My order is 88213."},
        {"role": "assistant", "content": "I will look it up. " + "Let me check. " * 30},
        *EVICTED[1:3],
        {"role": "user", "content": "Thanks a lot, that is kind."},
    ]
    # Room for a few lines: the user's fact and requirement first, then the rest.
    text = digest(None, evicted, max_tokens=15, counter=COUNTER)
    assert text.splitlines() == ["User requests:", "- My order is 88213."]
    fuller = digest(None, evicted, max_tokens=200, counter=COUNTER).splitlines()
    assert fuller[:3] == ["User requests:", "- My order is 88213.", "- Thanks a lot, that is kind."]
    assert "Tool calls:" in fuller and "Decisions:" in fuller


def test_a_long_sentence_keeps_the_clauses_that_tell() -> None:
    rambling = "well we have been going back and forth on it all week long " * 3
    evicted = [{"role": "user", "content": f"So {rambling}, and the budget is $4,500 in the end."}]
    (line,) = digest(None, evicted, max_tokens=200, counter=COUNTER).splitlines()[1:]
    assert line == "- … the budget is $4,500 in the end."


def test_requirements_names_dates_and_quotes_tell() -> None:
    for sentence in (
        "Never book a red-eye.",
        "We want the aisle.",
        "Invite Dr Okafor too.",
        "It was on the fourth of May.",
        'Call it "blue lagoon".',
        "Mail me at mia@example.com.",
    ):
        assert telling(sentence), sentence
    for sentence in ("Thanks, that is kind.", "Let me know if you need anything.", "Hm, ok."):
        assert not telling(sentence), sentence


def test_what_the_view_still_shows_is_left_out() -> None:
    evicted = [{"role": "user", "content": "My order is 88213. Please rush it."}]
    text = digest(None, evicted, max_tokens=200, counter=COUNTER, shown="x My order is 88213. y")
    assert text.splitlines() == ["User requests:", "- Please rush it."]


def test_nothing_to_tell_is_an_empty_digest() -> None:
    assert (
        digest(None, [{"role": "assistant", "content": ""}], max_tokens=50, counter=COUNTER) == ""
    )


def _build_log(fact: str, error: str | None = None) -> str:
    lines = [f"[build 07.{n:03d}] compiling module cache/ABCDE in {n * 7} ms" for n in range(40)]
    lines.insert(20, fact)
    if error is not None:
        lines.insert(30, error)
    return "\n".join(["== step 07 ==", *lines, "== step 07 =="])


def _shell_round(call_id: str, command: str, output: str) -> list[dict]:
    call = {
        "id": call_id,
        "type": "function",
        "function": {"name": "shell", "arguments": json.dumps({"command": command})},
    }
    return [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call_id, "content": output},
    ]


def test_tool_findings_errors_and_commands_are_kept() -> None:
    evicted = _shell_round(
        "c1",
        "cat logs/step-07.log",
        _build_log("FACT-07: the build cache key is 9f3a1c2e.", "ERROR: linker failed on x.o"),
    )
    text = digest(None, evicted, max_tokens=500, counter=COUNTER)
    assert "Findings:\n- FACT-07: the build cache key is 9f3a1c2e." in text
    assert "- shell: ERROR: linker failed on x.o" in text
    assert "- shell(command=cat logs/step-07.log)" in text


def test_tool_findings_come_before_tool_calls_and_roll_into_the_next_digest() -> None:
    rounds = [
        _shell_round(f"c{n}", f"cat logs/step-{n:02d}.log", _build_log(f"FACT-{n:02d}: k{n}."))
        for n in range(1, 9)
    ]
    first = digest(None, [m for r in rounds[:4] for m in r], max_tokens=500, counter=COUNTER)
    rolled = digest(first, [m for r in rounds[4:] for m in r], max_tokens=500, counter=COUNTER)
    assert all(f"- FACT-{n:02d}: k{n}." in rolled for n in range(1, 9))
    tight = digest(None, [m for r in rounds for m in r], max_tokens=120, counter=COUNTER)
    assert all(f"FACT-{n:02d}" in tight for n in range(1, 9)) and "step-01.log" not in tight


def test_an_output_without_a_template_has_no_findings() -> None:
    source = "\n".join(f"def f{n}(x):\n    return x + {n}" for n in range(5))
    text = digest(None, _shell_round("c1", "cat a.py", source), max_tokens=500, counter=COUNTER)
    assert "Findings" not in text
