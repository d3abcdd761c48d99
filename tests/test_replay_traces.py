"""End to end: the recorded traces (tests/data) replayed turn by turn through the proxy, joined
into long sessions, with the real openai SDK in front and the strict fake upstream behind.

Run with `pytest -s` to see the tokens sent and forwarded.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from policies import current_turn, is_system
from tests.conversations import view_problems
from tests.replay import (
    JOIN,
    Turn,
    broken_pairs,
    budget_limit,
    joined,
    prompt_tokens,
    replay,
    replay_servers,
    traces_replay,
    upstream_rejection,
)


def check_served(turns: Sequence[Turn]) -> list[str]:
    """Every served turn: the upstream accepted all it got and each view keeps the invariants."""
    problems = []
    for i, turn in enumerate(turns):
        if turn.status != 200:
            continue
        problems += [
            f"turn {i}: upstream: {r}" for b in turn.forwarded if (r := upstream_rejection(b))
        ]
        problems += [f"turn {i}: {p}" for p in view_problems(turn.sent, turn.view or [])]
        if not turn.reply:
            problems.append(f"turn {i}: empty reply")
    return problems


def report(label: str, turns: Sequence[Turn]) -> tuple[int, int]:
    served = [t for t in turns if t.status == 200]
    sent = sum(t.tokens_before for t in served)
    forwarded = sum(t.tokens_after for t in served)
    actions = Counter(t.action for t in served)
    refused = sum(t.refused for t in turns)
    print(
        f"\n{label}: {len(turns)} turns, {len(served)} served, {refused} refused by the proxy;"
        f" tokens sent {sent}, forwarded {forwarded} ({forwarded / sent:.1%}); {dict(actions)}"
    )
    return sent, forwarded


def floor_tokens(turn: Turn) -> int:
    """What no compaction can remove: the system messages and the current turn."""
    kept = set(current_turn(turn.sent))
    floor = [m for i, m in enumerate(turn.sent) if is_system(m) or i in kept]
    return prompt_tokens(floor, "gpt-4o-4k")


def test_every_trace_at_8k_is_served_whole_and_valid() -> None:
    sessions = traces_replay("gpt-4o-8k", JOIN)
    turns = [t for s in sessions for t in s]
    sent, forwarded = report("traces at 8192", turns)

    assert len(turns) > 1000 and len(sessions) > 20
    assert [t.status for t in turns if t.status != 200] == []
    assert broken_pairs(turns) == []
    assert check_served(turns) == []
    assert all(len(t.forwarded) == 1 for t in turns)  # no reactive retry was needed
    assert forwarded < sent
    assert {t.action for t in turns} == {"none", "compacted", "replayed"}  # none degraded


def test_at_4k_turns_that_cannot_fit_get_a_clear_400_and_the_rest_are_served() -> None:
    turns = [t for s in traces_replay("gpt-4o-4k", JOIN, 0, 24) for t in s]
    sent, forwarded = report("traces 0-23 at 4096", turns)
    refused = [t for t in turns if t.refused]
    limit = budget_limit("gpt-4o-4k")

    assert refused, "the subset has turns whose system prompt and current turn exceed 4k"
    assert all(t.status == 200 for t in turns if not t.refused)
    assert "degraded" not in {t.action for t in turns}
    assert broken_pairs(turns) == []
    assert check_served(turns) == []
    assert forwarded < sent
    # Refused exactly when the system messages and the current turn cannot fit.
    assert all(floor_tokens(t) > limit for t in refused)
    assert all(floor_tokens(t) <= limit for t in turns if t.status == 200)
    for turn in refused:
        error = turn.error
        assert set(error) == {"message", "type", "param", "code"}
        assert error["type"] == "invalid_request_error"
        assert "4096" in error["message"] and "current turn" in error["message"]


def test_a_streamed_session_is_compacted_and_served_like_a_plain_one() -> None:
    session = joined(JOIN, 4, 8)[0]
    with replay_servers() as (up, client):
        turns = replay(client, up, session, model="gpt-4o-8k", stream=True)
    report("one session streamed at 8192", turns)

    assert all(t.status == 200 for t in turns)
    assert all(b.get("stream") is True for t in turns for b in t.forwarded)
    assert broken_pairs(turns) == []
    assert check_served(turns) == []
    assert {t.action for t in turns} == {"none", "compacted", "replayed"}
