"""The per-message memo (proxy/memo.py): bounded, exact, and still of use when the sessions
talking at once hold more messages than it does."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.memo import Memo


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


@settings(max_examples=30, deadline=None)
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
