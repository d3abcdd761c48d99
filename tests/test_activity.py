"""A session's turns as the dashboard keeps them: their figures and the lines a record keeps
them in (proxy.sessions.turns), the process's ledger of those not written yet
(proxy.sessions.activity), how `TurnLog` writes them beside the state (at once the first
time, then at most every `write_seconds`, and at shutdown) and reads them back, and the
session's row in the list (proxy.sessions.listing)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson
import pytest

from proxy.observability.metrics import Metrics
from proxy.sessions.activity import Activity, ActivityLedger, Who
from proxy.sessions.cache_usage import CacheFigures, CacheUsage
from proxy.sessions.listing import Listed
from proxy.sessions.sessions import Sessions, session_key
from proxy.sessions.state import SessionState
from proxy.sessions.store import MemoryStore
from proxy.sessions.turn_log import TurnLog
from proxy.sessions.turns import StoredTurns, TurnCounts, TurnFigures, Turns

KEY = session_key("tenant", "session")
WHO = Who("tenant", "chat", "gpt-4o", "default")


def turn(at: float, sent: int = 100, forwarded: int = 100, action: str = "none") -> TurnFigures:
    layers = ("summarize",) if action == "compacted" else ()
    return TurnFigures(at, sent, forwarded, 900, 700, action, layers)


def activity(*turns: TurnFigures, who: Who = WHO) -> Activity:
    counts = TurnCounts(len(turns), sum(t.compaction for t in turns), sum(t.saved for t in turns))
    return Activity(who, counts, turns)


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
    assert a.counts == TurnCounts(3, 1, 800)
    assert activity(turn(1, 1000, 600, "shadow-compacted")).counts == TurnCounts(1, 0, 0)


def test_turns_are_lines_read_one_by_one_and_only_when_asked_for(
    caplog: pytest.LogCaptureFixture,
) -> None:
    text = Turns.of([turn(1), turn(2)]).then([turn(3)], 3).text
    assert len(text.split("\n")) == 3
    corrupt = Turns("[1, 2\n" + text)
    assert corrupt.last == turn(3)
    assert "corrupt" not in caplog.text  # the last line alone was read
    assert list(corrupt) == [turn(1), turn(2), turn(3)]
    assert "a corrupt turn of a session left out" in caplog.text
    assert Turns().last is None and list(Turns()) == []
    assert [t.at for t in Turns.of(map(turn, range(5))).then([turn(9)], 3)] == [3, 4, 9]


def test_an_activity_is_stored_and_read_back_and_added_to() -> None:
    stored = activity(turn(1), turn(3), turn(5)).stored()
    read = Activity.read(stored)
    assert read == activity(turn(1), turn(3), turn(5))
    later = activity(turn(6), turn(7), who=WHO._replace(model="gpt-5"))
    both = read.plus(later, 4)
    assert [t.at for t in both.recent] == [3, 5, 6, 7]
    assert both.counts.turns == 5 and both.who.model == "gpt-5"
    assert read.plus(None, 4) is read
    for who in (b"{", b'{"a": 1}', b"[1]"):
        with pytest.raises((TypeError, ValueError)):
            Activity.read(StoredTurns(who, TurnCounts(), ""))


def test_the_ledger_keeps_what_is_not_written_and_says_when_it_is_due() -> None:
    ledger = ActivityLedger(max_turns=3, write_seconds=10, max_sessions=2)
    assert ledger.due(KEY) == 0  # never written from here: due at once
    ledger.observe(KEY, WHO, turn(1))
    unwritten = ledger.unwritten(KEY)
    assert unwritten is not None and unwritten.counts.turns == 1
    ledger.observe(KEY, WHO, turn(2))  # comes while the first is being written
    ledger.written(KEY, unwritten)
    rest = ledger.unwritten(KEY)
    assert rest is not None and [t.at for t in rest.recent] == [2] and rest.counts.turns == 1
    ledger.observe(KEY, WHO, turn(3))
    assert 9 < ledger.due(KEY) <= 10  # due a while after that write
    for i in range(4, 9):
        ledger.observe(KEY, WHO, turn(i))
    rest = ledger.unwritten(KEY)
    assert rest is not None and rest.counts.turns == 7 and len(rest.recent) == 3  # bounded
    ledger.written(KEY, rest)
    assert ledger.unwritten(KEY) is None and ledger.sessions() == []
    others = [session_key("tenant", f"other {i}") for i in range(2)]
    for other in others:
        ledger.observe(other, WHO, turn(9))
    assert ledger.sessions() == others  # the oldest out
    ledger.forget(others[0])
    assert ledger.sessions() == others[1:]


def test_a_sessions_row_is_made_from_its_state_and_turns_and_read_back() -> None:
    cache = CacheUsage(CacheFigures(1, 100, 50), 5.0, CacheFigures(2, 400, 100))
    state = SessionState(prompt_cache=cache, pending="")
    row = Listed.of(KEY, 3, state, activity(turn(1), turn(2, 1000, 600, "compacted")))
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


def log_of(store: MemoryStore, write_seconds: float = 0.3) -> TurnLog:
    ledger = ActivityLedger(200, write_seconds)
    return TurnLog(store, ledger, Sessions(store, Metrics()).cache, Metrics())


async def test_turns_are_written_beside_the_state_at_once_then_every_write_seconds() -> None:
    store = MemoryStore(ttl_seconds=60)
    turns = log_of(store)
    turns.observe(KEY, WHO, turn(time.time()))
    await settle()
    stored = await store.turns(KEY)
    assert stored is not None and stored.counts.turns == 1  # a session's first turn lists it
    assert await store.get(KEY) is None  # no state: nothing for a request to read
    assert [row.at for row in await store.recent()] == [pytest.approx(time.time(), abs=1)]
    for _ in range(3):
        turns.observe(KEY, WHO, turn(time.time()))
    await settle()
    assert (await store.turns(KEY)).counts.turns == 1  # type: ignore[union-attr]
    shown = await turns.activity(KEY)
    assert shown is not None and shown.counts.turns == 4  # shown all the same
    assert [row.turns for row in await turns.recent()] == [4]
    await settle(0.35)
    assert (await store.turns(KEY)).counts.turns == 4  # type: ignore[union-attr]
    assert [row.turns for row in await turns.recent()] == [4]
    turns.observe(KEY, WHO, turn(time.time()))
    await turns.close()  # at shutdown, what is left
    assert (await store.turns(KEY)).counts.turns == 5  # type: ignore[union-attr]


class HeldStore(MemoryStore):
    """Adds turns, then holds the answer until let go: a write under way, as readers see it."""

    def __init__(self) -> None:
        super().__init__(ttl_seconds=60)
        self.held = asyncio.Event()
        self.go = asyncio.Event()

    async def add_turns(self, *args: Any, **kwargs: Any) -> Any:
        added = await super().add_turns(*args, **kwargs)
        self.held.set()
        await self.go.wait()
        return added


async def test_a_write_under_way_is_not_counted_twice() -> None:
    store = HeldStore()
    turns = log_of(store, write_seconds=60)
    for _ in range(3):
        turns.observe(KEY, WHO, turn(time.time()))
    await asyncio.wait_for(store.held.wait(), 1)
    turns.observe(KEY, WHO, turn(time.time()))  # comes meanwhile
    reading = asyncio.gather(turns.activity(KEY), turns.recent())
    await settle()
    store.go.set()
    shown, rows = await reading
    assert shown is not None and shown.counts.turns == 4
    assert [row.turns for row in rows] == [4]
    await turns.close()


async def test_corrupt_stored_turns_are_left_out() -> None:
    store = MemoryStore(ttl_seconds=60)
    await store.add_turns(KEY, StoredTurns(b"not json", TurnCounts(1), "x"), keep=200)
    turns = log_of(store)
    turns.observe(KEY, WHO, turn(5))
    shown = await turns.activity(KEY)
    assert shown is not None and [t.at for t in shown.recent] == [5]
    await turns.close()


def test_without_the_dashboard_no_turn_is_kept() -> None:
    assert Sessions(MemoryStore(ttl_seconds=60), Metrics()).turns is None
