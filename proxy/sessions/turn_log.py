"""Every session's turns, for the dashboard: kept in the process as they are served, written
beside the session's state by themselves, and read with those not written yet.

A turn is kept (`ActivityLedger.observe`, no store call); the session's turns are written
(`SessionStore.add_turns`, in the background) at once when this process has not written them
before, else `write_seconds` after its last write of them, and at shutdown. Each write lists
the session in the index of recent sessions (its row made from the counts the write returns
and the state it read back), and so does each write of the session's state (`relist`).
Requests never read the turns: a session that was never compacted has no state to parse.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from proxy.errors import StoreUnavailable
from proxy.observability.metrics import Metrics
from proxy.sessions.activity import Activity, ActivityLedger, Who
from proxy.sessions.cache_usage import CacheLedger
from proxy.sessions.listing import Listed
from proxy.sessions.recent import Listing
from proxy.sessions.state import SessionState
from proxy.sessions.store import SessionStore
from proxy.sessions.turns import TurnFigures

log = logging.getLogger("compaction_proxy")

# At shutdown, the turns not written yet are written for this long at most.
LAST_WRITES_SECONDS = 2.0


class TurnLog:
    def __init__(
        self, store: SessionStore, ledger: ActivityLedger, cache: CacheLedger, metrics: Metrics
    ) -> None:
        self.store = store
        self.ledger = ledger
        self.cache = cache
        self.metrics = metrics
        # A session's turns due to be written: the timer, then the write.
        self._writes: dict[str, asyncio.TimerHandle | asyncio.Task[None]] = {}
        self._relisting: set[asyncio.Task[None]] = set()
        self._closing = False

    def observe(self, key: str, who: Who, turn: TurnFigures) -> None:
        """A turn served: kept, and written a while after this process last wrote them."""
        self.ledger.observe(key, who, turn)
        if key not in self._writes:
            loop = asyncio.get_running_loop()
            self._writes[key] = loop.call_later(self.ledger.due(key), self._write, key)

    async def activity(self, key: str) -> Activity | None:
        """The session's turns: those written, and those this process has not written."""
        await self._settled([key])
        stored = await self.store.turns(key)
        unwritten = self.ledger.unwritten(key)
        if stored is None:
            return unwritten
        try:
            activity = Activity.read(stored)
        except (TypeError, ValueError):
            log.warning("corrupt turns of a session left out", extra={"session": key[:12]})
            return unwritten
        return activity.plus(unwritten, self.ledger.max_turns)

    async def recent(self) -> list[Listed]:
        """The recent sessions, newest first, with what this process has not written yet
        (and the sessions it has not written yet)."""
        await self._settled(list(self._writes))
        rows: dict[str, Listed] = {}
        for listing in await self.store.recent():
            try:
                row = Listed.from_bytes(listing.row)
            except ValueError:
                continue
            rows.setdefault(row.key, row)
        for key in self.ledger.sessions():
            rows.setdefault(key, Listed(key, 0))
        found = [
            row.plus(self.ledger.unwritten(key), self.cache.unwritten(key))
            for key, row in rows.items()
        ]
        return sorted(found, key=lambda row: row.at, reverse=True)

    def forget(self, key: str) -> None:
        self.ledger.forget(key)

    def relist(self, key: str, version: int, state: SessionState) -> None:
        """The session's state was written (a compaction, a summary prepared, the admin API):
        its row is made again with it, in the background, so that the list shows it before
        the session's next write of its turns."""
        task = asyncio.create_task(self._relisted(key, version, state))
        self._relisting.add(task)
        task.add_done_callback(self._relisting.discard)

    async def close(self) -> None:
        """Write what is not written yet, for `LAST_WRITES_SECONDS` at most."""
        self._closing = True
        for key, write in list(self._writes.items()):
            if not isinstance(write, asyncio.Task):  # a timer, of asyncio's or uvloop's
                write.cancel()
                self._write(key)
        writes = [w for w in self._writes.values() if isinstance(w, asyncio.Task)]
        if writes:
            await asyncio.wait(writes, timeout=LAST_WRITES_SECONDS)
        for task in [*writes, *self._relisting]:
            task.cancel()
        await asyncio.gather(*writes, *self._relisting, return_exceptions=True)

    async def _settled(self, keys: list[str]) -> None:
        """This process's writes of these sessions' turns done: a read meanwhile would count
        their turns twice (in the record, and as not written)."""
        writes = [w for k in keys if isinstance(w := self._writes.get(k), asyncio.Task)]
        if writes:
            await asyncio.wait(writes)

    def _write(self, key: str) -> None:
        self._writes[key] = asyncio.create_task(self._written(key))

    async def _written(self, key: str) -> None:
        try:
            activity = self.ledger.unwritten(key)
            if activity is not None:
                await self._add(key, activity)
        except StoreUnavailable:
            self.metrics.store_errors.labels("add_turns").inc()
        finally:
            del self._writes[key]
        if self.ledger.unwritten(key) is not None and not self._closing:
            # Turns came while writing, or the write failed: again in a while.
            loop = asyncio.get_running_loop()
            self._writes[key] = loop.call_later(self.ledger.write_seconds, self._write, key)

    async def _add(self, key: str, activity: Activity) -> None:
        """The turns added to the session's, and its row in the list of recent sessions."""
        added = activity.stored()
        counts, record = await self.store.add_turns(key, added, self.ledger.max_turns)
        self.ledger.written(key, activity)
        state, version = SessionState(), 0
        # A corrupt state is listed as none: its session's next request replaces it.
        with contextlib.suppress(ValueError):
            if record is not None:
                state, version = SessionState.from_bytes(record.data), record.version
        await self._list(key, version, state, Activity(activity.who, counts, activity.recent[-1:]))

    async def _relisted(self, key: str, version: int, state: SessionState) -> None:
        try:
            stored = await self.store.turns(key)
            if stored is not None:  # else its first turn lists it
                await self._list(key, version, state, Activity.read(stored))
        except (StoreUnavailable, TypeError, ValueError):
            pass  # the next write of its turns lists it

    async def _list(self, key: str, version: int, state: SessionState, turns: Activity) -> None:
        row = Listed.of(key, version, state, turns)
        await self.store.set_listing(key, Listing(row.to_bytes(), row.at))
