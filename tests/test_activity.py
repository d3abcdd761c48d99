"""A session's turns as the dashboard keeps them (proxy.sessions.activity): the figures, their
bounds, the process's ledger of those not written yet and how `Sessions` writes them (with the
session's next write, or by themselves at most every `write_seconds`); the session's row in
the list (proxy.sessions.listing), and the plan in words (proxy.server.session_view)."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

import orjson
import pytest

from proxy.observability.metrics import Metrics
from proxy.sessions.activity import Activity, ActivityLedger, TurnFigures, Who
from proxy.sessions.cache_usage import CacheFigures, CacheUsage
from proxy.sessions.listing import Listed
from proxy.sessions.sessions import Sessions, session_key
from proxy.sessions.state import SessionState
from proxy.sessions.store import MemoryStore

KEY = session_key("tenant", "session")
WHO = Who("tenant", "chat", "gpt-4o", "default")


def turn(at: float, sent: int = 100, forwarded: int = 100, action: str = "none") -> TurnFigures:
    layers = ("summarize",) if action == "compacted" else ()
    return TurnFigures(at, sent, forwarded, 900, 700, action, layers)


def activity(*turns: TurnFigures, who: Who = WHO) -> Activity:
    found = Activity.of(who, turns[0])
    for later in turns[1:]:
        found = found.then(who, later, 1000)
    return found


def test_a_turns_figures_round_trip_and_nothing_else_is_read() -> None:
    figures = turn(12.5, 1000, 600, "compacted")
    assert TurnFigures.from_list(orjson.loads(orjson.dumps(figures.to_list()))) == figures
    good = figures.to_list()
    for bad in (
        good[:6],
        {"at": 1},
        [float("inf"), *good[1:]],
        [*good[:1], -1, *good[2:]],
        [*good[:1], 1.5, *good[2:]],
        [*good[:5], 7, good[6]],
        [*good[:6], "summarize"],
        [*good[:6], [1]],
    ):
        with pytest.raises(TypeError):
            TurnFigures.from_list(bad)


def test_saved_tokens_and_compactions_count_what_was_done() -> None:
    a = activity(turn(1), turn(2, 1000, 600, "compacted"), turn(3, 1100, 700, "replayed"))
    assert (a.turns, a.compactions, a.saved) == (3, 1, 800)
    shadow = activity(turn(1, 1000, 600, "shadow-compacted"))
    assert (shadow.compactions, shadow.saved) == (0, 0)  # nothing was done to the request


def test_turns_added_up_keep_their_order_and_the_last_ones() -> None:
    stored = activity(turn(1), turn(3), turn(5))
    later = activity(turn(2), turn(4), turn(6), who=dataclasses.replace(WHO, model="gpt-5"))
    both = stored.plus(later, 4)
    assert [t.at for t in both.recent] == [3, 4, 5, 6]
    assert both.turns == 6 and both.who.model == "gpt-5"
    assert stored.plus(None, 4) is stored
    assert [t.at for t in activity(*(turn(i) for i in range(5))).then(WHO, turn(9), 3).recent] == [
        3,
        4,
        9,
    ]


def test_a_state_keeps_its_activity_and_a_corrupt_one_is_refused() -> None:
    state = SessionState(activity=activity(turn(1), turn(2, 500, 300, "compacted")))
    assert SessionState.from_bytes(state.to_bytes()) == state
    raw = orjson.loads(state.to_bytes())
    for corrupt in ({**raw["activity"], "turns": -1}, {**raw["activity"], "recent": []}, [1]):
        with pytest.raises(ValueError, match="not a session state"):
            SessionState.from_bytes(orjson.dumps({**raw, "activity": corrupt}))


async def test_the_turns_are_read_only_when_asked_for_and_corrupt_ones_as_none(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A request's read of its session leaves the turns as they are stored, a text: one that
    is not turns fails neither that read nor the session's next write."""
    stored = SessionState(activity=activity(turn(1), turn(2)))
    raw = orjson.loads(stored.to_bytes())
    raw["activity"]["recent"] = "[[1, 2, 3"
    state = SessionState.from_bytes(orjson.dumps(raw))
    assert state.activity is not None and state.activity.turns == 2
    store = MemoryStore(ttl_seconds=60)
    assert await store.compare_and_set(KEY, 0, orjson.dumps(raw)) == 1
    sessions = Sessions(store, Metrics(), turns=ActivityLedger(200, write_seconds=60))
    sessions.observe_turn(KEY, WHO, turn(3))
    await settle()
    written = (await sessions.load(KEY)).state.activity
    assert written is not None and written.turns == 3
    assert [t.at for t in written.recent] == [3]  # the corrupt ones left out
    assert "corrupt turns of a session left out" in caplog.text
    await sessions.close()


def test_the_ledger_keeps_what_is_not_written_and_says_when_it_is_due() -> None:
    ledger = ActivityLedger(max_turns=3, write_seconds=10, max_sessions=2)
    assert ledger.observe(KEY, WHO, turn(1)) == 0  # never written from here: due at once
    unwritten = ledger.unwritten(KEY)
    assert unwritten is not None and unwritten.turns == 1
    ledger.observe(KEY, WHO, turn(2))  # comes while the first is being written
    ledger.written(KEY, unwritten)
    rest = ledger.unwritten(KEY)
    assert rest is not None and [t.at for t in rest.recent] == [2] and rest.turns == 1
    assert 9 < ledger.observe(KEY, WHO, turn(3)) <= 10  # due a while after that write
    for i in range(4, 9):
        ledger.observe(KEY, WHO, turn(i))
    rest = ledger.unwritten(KEY)
    assert rest is not None and rest.turns == 7 and len(rest.recent) == 3  # bounded
    ledger.written(KEY, rest)
    assert ledger.unwritten(KEY) is None and ledger.sessions() == []
    others = [session_key("tenant", f"other {i}") for i in range(2)]
    for other in others:
        ledger.observe(other, WHO, turn(9))
    assert ledger.sessions() == others  # the oldest out
    ledger.forget(others[0])
    assert ledger.sessions() == others[1:]


def test_a_sessions_row_is_made_from_its_state_and_read_back() -> None:
    assert Listed.of(KEY, 3, SessionState()) is None  # no turn yet: not listed
    cache = CacheUsage(CacheFigures(1, 100, 50), 5.0, CacheFigures(2, 400, 100))
    state = SessionState(
        activity=activity(turn(1), turn(2, 1000, 600, "compacted")),
        prompt_cache=cache,
        pending="",
    )
    row = Listed.of(KEY, 3, state)
    assert row is not None
    assert (row.key, row.version, row.at, row.tenant, row.turns) == (KEY, 3, 2.0, "tenant", 2)
    assert (row.sent, row.forwarded, row.action, row.saved) == (1000, 600, "compacted", 400)
    assert (row.pending, row.prepared, row.to_dict()["cache_read_share"]) == (True, False, 0.25)
    assert Listed.from_bytes(row.to_bytes()) == row
    later = row.plus(activity(turn(3, 1100, 700, "replayed")), cache)
    assert (later.turns, later.compactions, later.saved, later.at) == (3, 1, 800, 3.0)
    assert (later.action, later.prompt_tokens, later.cache_read_tokens) == ("replayed", 800, 200)
    for bad in (b"{", b"[1]", orjson.dumps([*orjson.loads(row.to_bytes())[:-1], "yes"])):
        with pytest.raises(ValueError, match="not a listed session"):
            Listed.from_bytes(bad)


async def settle(seconds: float = 0.05) -> None:
    await asyncio.sleep(seconds)


async def test_turns_are_written_with_the_sessions_writes_and_by_themselves() -> None:
    store = MemoryStore(ttl_seconds=60)
    sessions = Sessions(store, Metrics(), turns=ActivityLedger(200, write_seconds=0.3))
    sessions.observe_turn(KEY, WHO, turn(time.time()))
    await settle()
    first = await store.get(KEY)
    assert first is not None and first.version == 1  # a session's first turn lists it
    assert [row.at for row in await store.recent()] == [pytest.approx(time.time(), abs=1)]
    for _ in range(3):
        sessions.observe_turn(KEY, WHO, turn(time.time()))
    await settle()
    assert (await sessions.load(KEY)).version == 1  # not before write_seconds
    shown = sessions.with_unwritten(KEY, await sessions.load(KEY))
    assert shown.activity is not None and shown.activity.turns == 4  # shown all the same
    await settle(0.35)
    loaded = await sessions.load(KEY)
    assert loaded.version == 2 and loaded.state.activity is not None
    assert loaded.state.activity.turns == 4
    # A write of the session's own takes the turns that wait along.
    sessions.observe_turn(KEY, WHO, turn(time.time()))
    assert await sessions.update(KEY, lambda s: dataclasses.replace(s, pending="now"))
    loaded = await sessions.load(KEY)
    assert loaded.state.activity is not None and loaded.state.activity.turns == 5
    assert [row.turns for row in await sessions.recent()] == [5]
    await settle(0.35)
    assert (await sessions.load(KEY)).version == 3  # nothing left to write by itself
    await sessions.close()


class HeldStore(MemoryStore):
    """Writes, then holds the answer until let go: a write under way, as readers see it."""

    def __init__(self) -> None:
        super().__init__(ttl_seconds=60)
        self.held = asyncio.Event()
        self.go = asyncio.Event()

    async def compare_and_set(self, *args: Any, **kwargs: Any) -> int | None:
        written = await super().compare_and_set(*args, **kwargs)
        self.held.set()
        await self.go.wait()
        return written


async def test_a_write_under_way_is_not_counted_twice() -> None:
    store = HeldStore()
    sessions = Sessions(store, Metrics(), turns=ActivityLedger(200, write_seconds=60))
    for _ in range(3):
        sessions.observe_turn(KEY, WHO, turn(time.time()))
    await asyncio.wait_for(store.held.wait(), 1)
    sessions.observe_turn(KEY, WHO, turn(time.time()))  # comes meanwhile
    shown = sessions.with_unwritten(KEY, await sessions.load(KEY))
    assert shown.activity is not None and shown.activity.turns == 4
    assert [row.turns for row in await sessions.recent()] == [4]
    store.go.set()
    await settle()
    shown = sessions.with_unwritten(KEY, await sessions.load(KEY))
    assert shown.activity is not None and shown.activity.turns == 4
    await sessions.close()


async def test_without_the_dashboard_no_turn_is_kept() -> None:
    store = MemoryStore(ttl_seconds=60)
    sessions = Sessions(store, Metrics())
    sessions.observe_turn(KEY, WHO, turn(1))
    await settle()
    assert await store.get(KEY) is None
    assert await sessions.update(KEY, lambda s: dataclasses.replace(s, pending=""))
    assert (await sessions.load(KEY)).state.activity is None
    assert await store.recent() == []
