"""What the dashboard shows of a session's turns: who talks in it (tenant, API, model,
policy), how many turns, compactions and tokens saved in all, and the figures of its last
turns (`turns`).

A request reads its session's state and, most of the time, writes nothing (a plan replays
without a write); a write of its own would add a store round trip to every request. So a
turn's figures are kept in this process (`ActivityLedger`), and `Sessions` adds them to the
session's record by themselves, beside its state (`SessionStore.add_turns`), at most once
every `admin.dashboard.write_seconds` a session: other replicas show them too, and no
request reads them.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import time
from collections.abc import Sequence
from typing import NamedTuple

import orjson

from proxy.memo import DEFAULT_MAX_SESSIONS, make_room
from proxy.sessions.turns import StoredTurns, TurnCounts, TurnFigures, Turns


class Who(NamedTuple):
    """Whose session, and how it talks to the proxy (its last turn's)."""

    tenant: str
    api: str
    model: str
    policy: str
    store: str = "ok"  # the store as the last turn found it: ok | unavailable


@dataclasses.dataclass(frozen=True)
class Activity:
    """A session's turns: the counts of all, the figures of the last ones (oldest first)."""

    who: Who
    counts: TurnCounts
    recent: Sequence[TurnFigures]  # this process's, or `Turns` as stored

    @property
    def last(self) -> TurnFigures | None:
        if isinstance(self.recent, Turns):
            return self.recent.last
        return self.recent[-1] if self.recent else None

    def plus(self, later: Activity | None, max_turns: int) -> Activity:
        """Both added up (`later`: turns this process has not written yet)."""
        if later is None:
            return self
        stored = self.recent if isinstance(self.recent, Turns) else Turns.of(self.recent)
        return Activity(later.who, self.counts + later.counts, stored.then(later.recent, max_turns))

    def stored(self) -> StoredTurns:
        """As the session's record keeps it."""
        return StoredTurns(orjson.dumps([*self.who]), self.counts, Turns.of(self.recent).text)

    @classmethod
    def read(cls, stored: StoredTurns) -> Activity:
        """The activity a record keeps; TypeError or ValueError when it is not one."""
        who = orjson.loads(stored.who)
        if not isinstance(who, list) or not all(isinstance(name, str) for name in who):
            raise TypeError("who is named by strings")
        return cls(Who(*who), stored.counts, Turns(stored.lines))


@dataclasses.dataclass
class _Entry:
    """A session's turns not written yet (`turns` of them; the last of them in `recent`)."""

    recent: collections.deque[TurnFigures]
    who: Who | None = None
    turns: int = 0
    compactions: int = 0
    saved: int = 0
    written_at: float = -math.inf  # time.monotonic() of this process's last write of them


class ActivityLedger:
    """Each session's turns that this process has seen and not yet written, and when it last
    wrote them (at most `max_sessions`: oldest out; at most `max_turns` turns each)."""

    def __init__(
        self, max_turns: int, write_seconds: float, max_sessions: int = DEFAULT_MAX_SESSIONS
    ) -> None:
        self.max_turns = max_turns
        self.write_seconds = write_seconds
        self.max_sessions = max_sessions
        self._entries: dict[str, _Entry] = {}

    def observe(self, key: str, who: Who, turn: TurnFigures) -> None:
        """Keep one turn."""
        entry = self._entries.get(key)
        if entry is None:
            make_room(self._entries, key, self.max_sessions)
            entry = self._entries[key] = _Entry(collections.deque(maxlen=self.max_turns))
        entry.who = who
        entry.turns += 1
        entry.compactions += turn.compaction
        entry.saved += turn.saved
        entry.recent.append(turn)

    def due(self, key: str) -> float:
        """The seconds until the session's turns are due to be written: `write_seconds` after
        this process last wrote them, at once when it never did."""
        entry = self._entries.get(key)
        written_at = -math.inf if entry is None else entry.written_at
        return max(0.0, written_at + self.write_seconds - time.monotonic())

    def unwritten(self, key: str) -> Activity | None:
        entry = self._entries.get(key)
        if entry is None or entry.who is None or not entry.turns:
            return None
        counts = TurnCounts(entry.turns, entry.compactions, entry.saved)
        return Activity(entry.who, counts, (*entry.recent,))

    def sessions(self) -> list[str]:
        """The sessions with turns not written yet."""
        return [key for key, entry in self._entries.items() if entry.turns]

    def written(self, key: str, activity: Activity) -> None:
        """The session's turns were written, `activity` as `unwritten` gave it: only the turns
        that came since stay."""
        entry = self._entries.get(key)
        if entry is None:
            return
        entry.written_at = time.monotonic()
        entry.turns -= activity.counts.turns
        entry.compactions -= activity.counts.compactions
        entry.saved -= activity.counts.saved
        while len(entry.recent) > entry.turns:
            entry.recent.popleft()

    def forget(self, key: str) -> None:
        self._entries.pop(key, None)
