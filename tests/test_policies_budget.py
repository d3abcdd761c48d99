"""The budget of a request: what a policy reserves, its levels, and when there is no room."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies import Policy
from policies.budget import MIN_TARGET_TOKENS
from policies.context import turn_growth

POLICY = {
    "reserved_output_tokens": 4096,
    "safety_margin_tokens": 100,
    "prepare_at": 0.6,
    "compact_at": 0.85,
    "target": 0.45,
    "headroom_turns": 3,
    "target_floor": 0.3,
}


def budget(**changes: object):
    request = {"window": 8192, "model_max_output": None, "request_max_tokens": None}
    policy = Policy(**{**POLICY, **{k: v for k, v in changes.items() if k in POLICY}})
    return policy.budget(**{**request, **{k: v for k, v in changes.items() if k in request}})


def test_reserved_output_is_the_clients_max_tokens_exactly() -> None:
    assert budget(request_max_tokens=5000).reserved_output == 5000
    assert budget(request_max_tokens=0).reserved_output == 0


def test_reserved_output_otherwise_scales_with_the_window() -> None:
    assert budget().reserved_output == 2048  # a quarter of 8192
    assert budget(window=1_000_000).reserved_output == 4096
    assert budget(window=1_000_000, model_max_output=1000).reserved_output == 1000


def test_levels_are_fractions_of_the_usable_budget() -> None:
    b = budget()
    assert b.limit == 8192 - 2048 - 100
    assert (b.prepare_tokens, b.compact_tokens, b.target_tokens) == (
        int(b.limit * 0.6),
        int(b.limit * 0.85),
        int(b.limit * 0.45),
    )
    assert b.status(b.prepare_tokens - 1) == "ok"
    assert b.status(b.prepare_tokens) == "prepare"
    assert b.status(b.compact_tokens) == "compact"
    assert b.usable


@pytest.mark.parametrize(
    ("window", "max_tokens"),
    [(100, 500), (8192, 8192), (8192, 8100), (8192, 8091), (8192, 7900), (8192, 7524)],
)
def test_a_budget_without_room_for_a_prompt_is_not_usable(window: int, max_tokens: int) -> None:
    """A max_tokens that takes (nearly) the whole window leaves (next to) nothing to compact
    to: the request must go upstream unchanged, never be compacted to nothing."""
    b = budget(window=window, request_max_tokens=max_tokens)
    assert b.limit >= 0 and b.target_tokens >= 0
    assert not b.usable
    assert {b.status(tokens) for tokens in (0, 1, 10_000)} == {"ok"}


@given(
    window=st.integers(min_value=0, max_value=2_000_000),
    max_tokens=st.none() | st.integers(min_value=-(2**63), max_value=2**63),
)
def test_a_usable_budget_always_leaves_room_to_compact_into(
    window: int, max_tokens: int | None
) -> None:
    b = budget(window=window, request_max_tokens=max_tokens)
    assert 0 <= b.target_tokens <= b.compact_tokens <= b.limit <= window
    assert b.reserved_output >= 0
    assert b.usable == (b.target_tokens >= MIN_TARGET_TOKENS)
    if max_tokens is not None and max_tokens <= 0:  # nothing to reserve: the largest budget
        assert b.limit == max(0, window - POLICY["safety_margin_tokens"])


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"target": 0.9}, "levels must satisfy 0 < target < compact_at <= 1"),
        ({"compact_at": 1.5}, "levels must satisfy 0 < target < compact_at <= 1"),
        ({"target": 0}, "levels must satisfy 0 < target < compact_at <= 1"),
        ({"prepare_at": 0}, "levels must satisfy 0 < prepare_at <= compact_at"),
        ({"prepare_at": 0.9}, "levels must satisfy 0 < prepare_at <= compact_at"),
        ({"safety_margin_tokens": -1}, "safety_margin_tokens must not be negative"),
        ({"headroom_turns": -1}, "headroom_turns must not be negative"),
        ({"target_floor": 0}, "target_floor must be in (0, 1]"),
        ({"window": -1}, "the window must not be negative"),
    ],
)
def test_budget_rejects_nonsense(changes: dict, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        budget(**changes)


def test_the_aim_leaves_room_for_the_next_turns_down_to_the_floor() -> None:
    b = budget()  # limit 6044: compact at 5137, target 2719, floor 1813
    policy = Policy(**POLICY)
    assert policy.aim(b, 0) == policy.aim(b, 700) == b.target_tokens  # small turns: no change
    assert policy.aim(b, 1000) == b.compact_tokens - 3 * 1000  # three such turns fit
    assert policy.aim(b, 5000) == int(b.limit * 0.3)  # never below the floor
    assert Policy(**{**POLICY, "headroom_turns": 0}).aim(b, 5000) == b.target_tokens
    # A floor above the target leaves the target as it is.
    assert Policy(**{**POLICY, "target_floor": 0.8}).aim(b, 5000) == b.target_tokens


def test_a_compaction_without_room_for_the_headroom_turns_is_short() -> None:
    b = budget()  # compact at 5137
    policy = Policy(**POLICY)
    assert not policy.short(b, 1000, b.compact_tokens - 3 * 1000)  # three more turns fit
    assert policy.short(b, 1000, b.compact_tokens - 3 * 1000 + 1)
    # Without headroom, still at least the next turn: one that leaves no room for it is short.
    no_headroom = Policy(**{**POLICY, "headroom_turns": 0})
    assert no_headroom.short(b, 1000, b.compact_tokens - 999)
    assert not no_headroom.short(b, 1000, b.compact_tokens - 1000)


def test_the_growth_of_a_turn_is_the_mean_of_the_newest_turns() -> None:
    chain = [{"role": r} for r in ("user", "assistant", "user", "assistant", "tool", "tool")]
    tokens = [5, 10, 20, 30, 40, 50]
    assert turn_growth(tokens, chain) == (10 + 20 + 30 + 40 + 50) // 2
    assert turn_growth(tokens, chain, turns=1) == 30 + 40 + 50
    assert turn_growth([5], [{"role": "user"}]) == 0
