"""SessionState: what the proxy stores per session, its branches and its serialisation."""

from __future__ import annotations

import math
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies import Chain, Plan, Summary
from proxy.models.calibration import Counting
from proxy.sessions.cache_usage import CacheFigures, CacheUsage
from proxy.sessions.state import (
    MAX_MEMORY,
    MAX_MEMORY_BYTES,
    Branch,
    ParsedStates,
    Prepared,
    SessionState,
)
from tests.conversations import conversations

text = st.text(st.characters(exclude_categories=("Cs",)), max_size=20)
hexes = st.text("0123456789abcdef", min_size=32, max_size=32)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
    max_leaves=6,
)
messages = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "tool"]), "content": text},
    optional={"x_extra": json_values},
)
plans = st.builds(
    Plan,
    cut=st.integers(0, 40),
    summary=st.none() | st.builds(Summary, text, st.sampled_from(["llm", "digest"])),
    edits=st.dictionaries(st.integers(0, 60), st.none() | messages, max_size=3),
    anchor_block=st.none() | text,
    covered=st.integers(0, 60),
)
branches = st.builds(Branch, plans, hexes, st.floats(0, 2e9))
memories = st.fixed_dictionaries(
    {
        "kind": st.sampled_from(["preference", "remember", "decision", "fact"]),
        "text": text,
        "confidence": st.floats(0, 1),
        "role": st.sampled_from(["user", "assistant"]),
    }
)
figures = st.builds(CacheFigures, *[st.integers(0, 2**40)] * 4)
answers = st.builds(CacheFigures, st.just(1), *[st.integers(0, 2**40)] * 3)  # one answer's
cache_usages = st.builds(CacheUsage, answers, st.floats(0, 2e9), figures)
states = st.builds(
    SessionState,
    branches=st.lists(branches, max_size=4).map(tuple),
    prepared=st.none()
    | st.builds(Prepared, st.integers(0, 40), st.integers(0, 40), hexes, hexes, text),
    decisions=st.lists(st.dictionaries(text, json_values, max_size=3), max_size=3).map(tuple),
    memory=st.lists(memories, max_size=3).map(tuple),
    calibration=st.none() | st.floats(0.5, 2.0),
    pending=st.none() | text,
    prompt_cache=st.none() | cache_usages,
    calibrated_for=st.none() | text,
)


@given(states)
def test_state_round_trips_through_bytes(state: SessionState) -> None:
    assert SessionState.from_bytes(state.to_bytes()) == state


FIELDS = (
    "branches",
    "prepared",
    "decisions",
    "memory",
    "calibration",
    "pending",
    "prompt_cache",
    "calibrated_for",
)


@given(st.dictionaries(st.sampled_from(FIELDS), json_values) | json_values)
def test_a_record_is_a_usable_state_or_refused(raw: Any) -> None:
    """Whatever is stored (a corrupt record, an older format), the proxy gets either a state
    it can use or a ValueError, never a state that fails later on the request path."""
    try:
        state = SessionState.from_bytes(orjson.dumps(raw))
    except ValueError:
        return
    assert state.calibration is None or (
        isinstance(state.calibration, float) and math.isfinite(state.calibration)
    )
    assert state.calibration is None or state.calibration > 0
    assert state.pending is None or isinstance(state.pending, str)
    assert state.calibrated_for is None or isinstance(state.calibrated_for, str)
    assert all(isinstance(d, dict) for d in state.decisions)
    assert all(isinstance(m, dict) and isinstance(m.get("text"), str) for m in state.memory)
    if state.prepared is not None:
        prepared = state.prepared
        assert all(isinstance(v, int) for v in (prepared.start, prepared.end))
        assert all(isinstance(v, str) for v in (prepared.chain, prepared.base, prepared.text))
    chain = Chain.of([{"role": "user", "content": "hi"}])
    state.branch(chain)
    state.with_memory([{"kind": "fact", "text": "I am here.", "confidence": 0.6}])
    assert SessionState.from_bytes(state.to_bytes()) == state


def test_a_calibration_serves_only_what_it_was_learnt_for() -> None:
    """A ratio is stored with the name of what it was learnt for; one of a record written
    before it said (the previous version's, as it writes them still beside this one) may be
    any model's: loaded, kept, but taken by no request."""
    llama, gpt = Counting("estimate:local-llama", False), Counting("o200k_base:gpt-4o", True)
    state = SessionState().with_calibration(2.5, llama)
    assert state.to_dict()["calibrated_for"] == "estimate:local-llama"
    again = SessionState.from_bytes(state.to_bytes())
    assert (again.ratio_for(llama), again.ratio_for(gpt)) == (2.5, None)
    assert again.with_calibration(None, gpt) == again  # nothing learnt: the stored one stays
    older = SessionState.from_bytes(b'{"v": 1, "branches": [], "calibration": 2.5}')
    assert older.calibration == 2.5 and older.ratio_for(llama) is None
    assert "calibrated_for" not in older.to_dict()  # written as the previous version does


def test_garbage_is_refused() -> None:
    for data in (b"", b"\xff", b"null", b"[]", b'{"branches": {}}', b'{"v": 1}'):
        try:
            SessionState.from_bytes(data)
        except ValueError:
            continue
        raise AssertionError(f"accepted {data!r}")


# -- branches -----------------------------------------------------------------------------------


def branch_over(messages: list[dict[str, Any]], cut: int = 2, used: float = 0.0) -> Branch:
    chain = Chain.of(messages)
    plan = Plan(cut=cut, summary=Summary("s", "llm"), covered=len(chain))
    return Branch(plan, chain.prefix(len(chain)), used)


def chat(rounds: int, variant: str = "") -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "Be brief."}]
    for i in range(rounds):
        messages += [
            {"role": "user", "content": f"question {i}{variant if i == 0 else ''}"},
            {"role": "assistant", "content": "OK"},  # the same text every time
        ]
    return messages


def test_a_branch_applies_to_its_history_and_to_what_grew_from_it() -> None:
    messages = chat(4)
    branch = branch_over(messages)
    grown = [*messages, {"role": "user", "content": "and then?"}]
    assert branch.matches(Chain.of(messages)) and branch.matches(Chain.of(grown))
    assert not branch.matches(Chain.of(messages[:-1]))  # shorter than what it covers
    # System messages are not part of the chain: a new date in the prompt changes nothing.
    assert branch.matches(Chain.of([{"role": "system", "content": "Today is Monday."}, *grown]))
    # What SDKs echo back differently is not a change either.
    echoed = [
        {**m, "refusal": None, "annotations": []} if m["role"] == "assistant" else m
        for m in messages
    ]
    assert branch.matches(Chain.of(echoed))


@given(st.data())
def test_an_edit_inside_the_covered_prefix_never_matches(data: st.DataObject) -> None:
    messages = data.draw(conversations())
    chain = Chain.of(messages)
    if len(chain) == 0:
        return
    branch = branch_over(messages, cut=0)
    positions = [i for i, m in enumerate(messages) if m["role"] not in ("system", "developer")]
    where = data.draw(st.sampled_from(positions))
    edited = [dict(m) for m in messages]
    edited[where]["content"] = f"edited: {edited[where].get('content')!r}"
    assert branch.matches(Chain.of(messages))
    assert not branch.matches(Chain.of(edited))


def test_the_longest_matching_branch_is_chosen() -> None:
    short, long = branch_over(chat(3)), branch_over(chat(6))
    other = branch_over(chat(8, variant=" (edited)"))
    state = SessionState(branches=(short, other, long))
    assert state.branch(Chain.of(chat(7))) == long
    assert state.branch(Chain.of(chat(4))) == short
    assert state.branch(Chain.of(chat(2))) is None
    assert state.branch(Chain.of(chat(9, variant=" (edited)"))) == other
    assert SessionState().branch(Chain.of(chat(2))) is None


def test_a_new_plan_replaces_its_own_branch_and_keeps_the_others() -> None:
    old = branch_over(chat(3), used=1.0)
    other = branch_over(chat(3, variant=" (edited)"), used=2.0)
    new = branch_over(chat(5), cut=4, used=3.0)
    state = SessionState(branches=(old, other)).with_branch(new, Chain.of(chat(5)), 4)
    assert state.branches == (new, other)


def test_at_most_max_branches_least_recently_used_out() -> None:
    variants = [branch_over(chat(3, variant=f" v{i}"), used=float(i)) for i in range(6)]
    state = SessionState(branches=tuple(reversed(variants[:5])))  # any order
    newest = variants[5]
    state = state.with_branch(newest, Chain.of(chat(3, variant=" v5")), 3)
    assert state.branches == (newest, variants[4], variants[3])


# -- decisions and memory ----------------------------------------------------------------------


def test_memory_keeps_the_latest_capped_and_once() -> None:
    state = SessionState()
    for i in range(30):
        state = state.with_memory([{"kind": "fact", "text": f"fact {i}", "confidence": 0.6}])
    state = state.with_memory([{"kind": "fact", "text": "fact 12", "confidence": 0.6}])
    texts = [m["text"] for m in state.memory]
    assert len(texts) == MAX_MEMORY
    assert texts[-1] == "fact 12" and texts.count("fact 12") == 1
    assert texts[0] == "fact 10"
    long = "我喜欢简洁的回答。" * 400
    (kept,) = SessionState().with_memory([{"kind": "preference", "text": long}]).memory
    assert len(kept["text"].encode()) <= MAX_MEMORY_BYTES
    assert long.startswith(kept["text"])


def test_decisions_keep_the_latest() -> None:
    state = SessionState()
    for i in range(80):
        state = state.with_decisions([{"layer": "summarize", "tokens_after": i}])
    assert [d["tokens_after"] for d in state.decisions] == list(range(30, 80))


def test_a_record_read_again_is_not_parsed_again_while_its_bytes_are_the_same() -> None:
    states = ParsedStates(size=2)
    data = SessionState(calibration=1.5).to_bytes()
    first = states.parse("a", data)
    assert states.parse("a", bytes(bytearray(data))) is first  # equal bytes, another object
    written = SessionState(calibration=2.0).to_bytes()
    assert states.parse("a", written).calibration == 2.0  # another record: parsed
    again = states.parse("a", written)
    other = states.parse("b", data)
    states.parse("a", written)  # the most recently read stays ...
    states.parse("c", data)  # ... when the oldest goes
    assert states.parse("a", written) is again
    assert states.parse("b", data) is not other
    with pytest.raises(ValueError):
        states.parse("d", b"not a state")
