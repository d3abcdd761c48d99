"""The per-message memo (proxy/memo.py): bounded, exact, and still of use when the sessions
talking at once hold more messages than it does."""

from __future__ import annotations

import functools

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies import Chain
from policies.chain import chain_digests
from proxy.compaction.histories import SessionHistories
from proxy.dialects.openai.chat import Chat
from proxy.memo import Memo, MessageDigests, content_keys
from proxy.models.tokens import counter_for
from tests.conftest import examples


def lookups(memo: Memo[int], keys: list[int]) -> tuple[int, int]:
    """Look every key up (its value is its square); the hits and misses it took."""
    hits, misses = memo.hits, memo.misses
    for key in keys:
        assert memo.get(key, lambda k: k * k, key) == key * key
        assert len(memo) <= memo.size
    return memo.hits - hits, memo.misses - misses


@given(st.integers(2, 64), st.lists(st.integers(0, 200), max_size=2000))
def test_bounded_and_exact(size: int, keys: list[int]) -> None:
    lookups(Memo(size), keys)


@given(st.integers(2, 64), st.data())
def test_a_working_set_of_half_the_size_misses_once_per_value(
    size: int, data: st.DataObject
) -> None:
    values = data.draw(st.lists(st.integers(), min_size=1, max_size=size // 2, unique=True))
    order = data.draw(st.lists(st.sampled_from(values), max_size=500))
    _, misses = lookups(Memo(size), values + order)
    assert misses == len(values)


@settings(max_examples=examples(30), deadline=None)
@given(st.integers(64, 2048), st.floats(0.6, 1.8))
def test_a_working_set_larger_than_the_memo_still_hits(size: int, ratio: float) -> None:
    """Histories resent in turn: least-recently-used alone would never hit (above half the
    size, each generation dropped is the one asked for next)."""
    cycle = list(range(int(size * ratio)))
    memo = Memo(size)
    lookups(memo, cycle * 3)  # settled
    hits, misses = lookups(memo, cycle * 6)
    assert hits / (hits + misses) >= 0.3 / ratio


@pytest.mark.parametrize("before", [range(2048), range(4096)])
def test_a_new_working_set_replaces_the_old_one(before: range) -> None:
    """After messages never asked for again, or a working set too large (the memo freezes
    now and then), a new one that fits is soon kept whole."""
    memo = Memo(1024)
    lookups(memo, list(before) * 4)
    fresh = list(range(10**6, 10**6 + 800))
    lookups(memo, fresh * 6)
    assert lookups(memo, fresh) == (len(fresh), 0)


@given(
    st.integers(2, 64),
    st.lists(st.lists(st.integers(0, 100), max_size=80), max_size=12),
    st.sampled_from([None, 40, 400]),
)
def test_each_is_get_of_each_value_in_turn(
    size: int, batches: list[list[int]], max_bytes: int | None
) -> None:
    """`each` (one pass of look-ups for what the newer generation holds) leaves the memo as
    looking each value up in turn does: the same answers, hits, misses and entries."""
    by_each: Memo[int] = Memo(size, max_bytes=max_bytes)
    one_by_one: Memo[int] = Memo(size, max_bytes=max_bytes)
    for batch in batches:
        keys = [b"x" * (k % 7) + k.to_bytes(2, "big") for k in batch]

        def square(k: bytes) -> int:
            return int.from_bytes(k[-2:], "big") ** 2 + 1

        answers = by_each.each(keys, square, keys)
        assert answers == [one_by_one.get(k, square, k) for k in keys]
        assert answers == [square(k) for k in keys]
        assert (by_each.hits, by_each.misses) == (one_by_one.hits, one_by_one.misses)
        assert dict(by_each._recent) == dict(one_by_one._recent)
        assert dict(by_each._older) == dict(one_by_one._older)
        assert len(by_each) <= size
        if max_bytes is not None:
            held = sum(map(len, [*by_each._recent, *by_each._older]))
            assert held < max_bytes + 2 * 8  # two keys more at most (the longest has 8 bytes)


def test_a_message_changed_in_place_is_looked_at_again_not_served_from_the_chain_memo() -> None:
    """The chain's memo (`MessageDigests`: each message's digest, or its place outside the
    chain) is keyed by the message's own bytes: a message the client changes at the same
    place, here into its context and back, or the same text in another role, gets the chain
    its new content makes, not what the memo held for the message there before."""
    chat, digests = Chat(), MessageDigests()
    padding = "Earlier work on the parser, at some length. " * 8  # long enough to be split
    words = {"role": "user", "content": "What does <environment_context> hold?"}
    context = {"role": "user", "content": "<environment_context>cwd=/w</environment_context>"}
    parts = {"role": "user", "content": [{"type": "text", "text": context["content"]}]}
    system = {**context, "role": "system"}
    said = {**context, "role": "assistant"}
    # Each third message, and whether it stands outside the chain.
    turns = [(words, False), (context, True), (words, False), (said, False), (system, True)]
    turns += [(parts, True), (words, False), (parts, True)]
    for third, outside in turns:
        messages = [
            {"role": "user", "content": padding},
            {"role": "assistant", "content": "Done."},
            third,
            {"role": "assistant", "content": "Next?"},
        ]
        parsed = chat.parse(orjson.dumps({"model": "gpt-4o", "messages": messages}))
        # The split's keys (of the client's bytes), and content_keys (of the messages).
        for keys in (parsed.keys, content_keys(parsed.messages)):
            assert keys is not None
            memoised = Chain.of(parsed.messages, functools.partial(digests, keys=keys))
            fresh = Chain.of(parsed.messages)
            assert (memoised.digests, memoised.outside) == (fresh.digests, fresh.outside)
            assert (2 in memoised.outside) == outside


# Messages of each kind the chain treats apart: in it, a system message and a client's context
# outside it (`Chain.outside`), the same text in several roles.
_SAID = ["Fix the parser.", "<environment_context>cwd=/w</environment_context>", "Done.", "ok"]
message_kinds = st.builds(
    lambda role, text, n: {"role": role, "content": f"{text} {n}" if n else text},
    st.sampled_from(["user", "assistant", "system"]),
    st.sampled_from(_SAID),
    st.integers(0, 3),
)


def same_chain(chain: Chain, expected: Chain) -> None:
    assert (chain.digests, chain.outside) == (expected.digests, expected.outside)
    for n in range(-1, len(expected) + 2):
        assert chain.prefix(n) == expected.prefix(n)


@given(st.lists(message_kinds, max_size=12), st.lists(message_kinds, max_size=12), st.data())
def test_a_chain_followed_by_more_messages_is_the_chain_of_them_all(
    first: list[dict[str, str]], then: list[dict[str, str]], data: st.DataObject
) -> None:
    chain = Chain.of(first)
    for n in data.draw(st.lists(st.integers(0, len(first)), max_size=3)):
        chain.prefix(n)  # worked out before: the longer chain takes it over
    same_chain(chain.followed_by(chain_digests(then)), Chain.of(first + then))
    same_chain(chain, Chain.of(first))  # left as it was


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["a", "b", "c"]),  # the session
            st.sampled_from(["grow", "same", "rewind", "edit", "new"]),
            st.lists(message_kinds, min_size=1, max_size=6),
            st.integers(0, 1),  # which of two counters
        ),
        max_size=25,
    )
)
@settings(deadline=None)  # the first example loads the exact counter's encoding
def test_each_turn_of_session_histories_is_its_own_counts_and_chain(
    turns: list[tuple[str, str, list[dict[str, str]], int]],
) -> None:
    """Whatever a session sends next (its history grown, the same, cut short, changed in the
    middle, or another), and whichever counter counts it, `SessionHistories.read` gives the
    counts and the chain of that history alone, for more sessions than it holds."""
    histories = SessionHistories(MessageDigests(), size=2)
    counters = (counter_for("gpt-4o"), counter_for("claude-sonnet-4-5"))  # exact, estimate
    assert counters[0].mode == "exact" and counters[1].mode == "estimate"
    sent: dict[str, list[dict[str, str]]] = {}
    keyed: dict[str, list[int]] = {}
    for session, change, messages, which in turns:
        last = sent.get(session, [])
        history = {
            "grow": last + messages,
            "same": last,
            "rewind": last[: len(last) // 2],
            "edit": [*last[:-2], messages[0], *last[-1:]] if len(last) > 2 else messages,
            "new": messages,
        }[change]
        sent[session] = history
        counter = counters[which]
        # The same history's keys as the same list, as a body sent again has them.
        same = change == "same" and session in keyed
        keys = keyed[session] if same else content_keys(history)
        keyed[session] = keys
        counts, chain = histories.read(session, history, keys, counter)
        assert counts == [counter.message(message) for message in history]
        assert counts.before == [sum(counts[:stop]) for stop in range(len(counts) + 1)]
        same_chain(chain, Chain.of(history))
