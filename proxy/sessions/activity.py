"""What the dashboard shows of a session's turns: who talks in it (tenant, API, model,
policy), how many turns, compactions and tokens saved in all, and the figures of its last
turns (tokens sent and forwarded, the levels, the action and a compaction's layers).

Most turns write nothing to the store (a plan replays without a write): a write of their own
would add a store round trip to every request. Like the prompt-cache figures
(`cache_usage`), a turn's figures are kept in this process (`ActivityLedger`) and go with the
session's next write; `Sessions` also writes them by themselves, at most once every
`admin.dashboard.write_seconds` a session, so that other replicas show them too.

Every request reads its session's record: the last turns are stored as one string of JSON
(`Turns`), read as such, and made into figures only when something asks for them (the
dashboard, a write), so that they cost a request's read next to nothing.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Iterator, Sequence
from typing import Any, overload

import orjson

from proxy.memo import DEFAULT_MAX_SESSIONS, make_room

log = logging.getLogger("compaction_proxy")

COMPACTIONS = ("compacted", "degraded")


@dataclasses.dataclass(frozen=True, slots=True)
class TurnFigures:
    """One turn, in the token counter's tokens."""

    at: float  # seconds since the epoch
    sent: int  # the client's request
    forwarded: int  # what the proxy made of it (under shadow mode: would have made)
    compact: int  # the compaction level then
    target: int  # the level a compaction aims at
    action: str  # as x-compaction-action says it (`shadow-…` under shadow mode)
    layers: tuple[str, ...] = ()  # a compaction's layers, in their order

    @property
    def compaction(self) -> bool:
        return self.action in COMPACTIONS

    @property
    def saved(self) -> int:
        """Tokens the client did not have to send upstream (none under shadow mode)."""
        return 0 if self.action.startswith("shadow-") else max(0, self.sent - self.forwarded)

    def to_list(self) -> list[Any]:
        figures = (self.sent, self.forwarded, self.compact, self.target)
        return [round(self.at, 3), *figures, self.action, list(self.layers)]

    @classmethod
    def from_list(cls, raw: Any) -> TurnFigures:
        """TypeError unless it is one of `to_list`."""
        if not isinstance(raw, list) or len(raw) != 7:
            raise TypeError("a turn is a list of its 7 figures")
        at, sent, forwarded, compact, target, action, layers = raw
        if type(at) not in (int, float) or not math.isfinite(at):
            raise TypeError("a time is a finite number")
        if any(type(n) is not int or n < 0 for n in (sent, forwarded, compact, target)):
            raise TypeError("token figures are counts")
        if not isinstance(action, str) or not isinstance(layers, list):
            raise TypeError("an action is a name, layers a list")
        if not all(isinstance(n, str) for n in layers):
            raise TypeError("layers are named")
        return cls(float(at), sent, forwarded, compact, target, action, tuple(layers))


class Turns(Sequence[TurnFigures]):
    """A session's last turns as stored (`text`, a JSON list of `TurnFigures.to_list`), made
    into figures when first read; a text that is not such a list reads as no turns (it must
    fail neither a request nor the session's next write)."""

    __slots__ = ("_figures", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        self._figures: tuple[TurnFigures, ...] | None = None

    def _read(self) -> tuple[TurnFigures, ...]:
        if self._figures is None:
            try:
                self._figures = tuple(TurnFigures.from_list(t) for t in orjson.loads(self.text))
            except (orjson.JSONDecodeError, TypeError):
                log.warning("corrupt turns of a session left out")
                self._figures = ()
        return self._figures

    @overload
    def __getitem__(self, index: int) -> TurnFigures: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[TurnFigures, ...]: ...

    def __getitem__(self, index: int | slice) -> TurnFigures | tuple[TurnFigures, ...]:
        return self._read()[index]

    def __len__(self) -> int:
        return len(self._read())

    def __iter__(self) -> Iterator[TurnFigures]:
        return iter(self._read())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and self._read() == tuple(other)

    __hash__ = None  # type: ignore[assignment]


def turns_text(turns: Sequence[TurnFigures]) -> str:
    """The text `Turns` reads: as it was read, when it was."""
    if isinstance(turns, Turns):
        return turns.text
    return orjson.dumps([t.to_list() for t in turns]).decode()


@dataclasses.dataclass(frozen=True, slots=True)
class Who:
    """Whose session, and how it talks to the proxy (its last turn's)."""

    tenant: str
    api: str
    model: str
    policy: str
    store: str = "ok"  # the store as the last turn found it: ok | unavailable


_WHO = tuple(field.name for field in dataclasses.fields(Who))


@dataclasses.dataclass(frozen=True, slots=True)
class Activity:
    """A session's turns: the counts of all, the figures of the last ones (oldest first)."""

    who: Who
    turns: int
    compactions: int
    saved: int
    recent: Sequence[TurnFigures]  # a tuple, or `Turns` as read from the store

    @classmethod
    def of(cls, who: Who, turn: TurnFigures) -> Activity:
        return cls(who, 1, int(turn.compaction), turn.saved, (turn,))

    @property
    def last(self) -> TurnFigures | None:
        return self.recent[-1] if self.recent else None

    def then(self, who: Who, turn: TurnFigures, max_turns: int) -> Activity:
        """This and a later turn."""
        kept = self.recent[max(0, len(self.recent) - max_turns + 1) :]
        compactions = self.compactions + turn.compaction
        return Activity(who, self.turns + 1, compactions, self.saved + turn.saved, (*kept, turn))

    def after(self, earlier: Activity) -> Activity | None:
        """What came after `earlier`, which this began with; None when nothing did."""
        since = self.turns - earlier.turns
        if since <= 0:
            return None
        return Activity(
            self.who,
            since,
            self.compactions - earlier.compactions,
            self.saved - earlier.saved,
            self.recent[-since:],
        )

    def plus(self, later: Activity | None, max_turns: int) -> Activity:
        """Both added up (`later`: turns this process has not written yet), the last
        `max_turns` turns kept, in the order they came (replicas write theirs in turn)."""
        if later is None:
            return self
        recent = sorted((*self.recent, *later.recent), key=lambda t: t.at)[-max_turns:]
        return Activity(
            later.who,
            self.turns + later.turns,
            self.compactions + later.compactions,
            self.saved + later.saved,
            tuple(recent),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            **dataclasses.asdict(self.who),
            "turns": self.turns,
            "compactions": self.compactions,
            "saved": self.saved,
            "recent": turns_text(self.recent),
        }

    @classmethod
    def from_dict(cls, raw: Any) -> Activity:
        """TypeError or KeyError unless it is one of `to_dict`."""
        names = [raw[name] for name in _WHO]
        if not all(isinstance(v, str) for v in names):
            raise TypeError("who is named by strings")
        counts = (raw["turns"], raw["compactions"], raw["saved"])
        if any(type(n) is not int or n < 0 for n in counts):
            raise TypeError("activity figures are counts")
        if not isinstance(raw["recent"], str):
            raise TypeError("the turns are stored as a text")
        return cls(Who(*names), *counts, Turns(raw["recent"]))


@dataclasses.dataclass
class _Entry:
    unwritten: Activity | None
    written_at: float  # time.monotonic() of this process's last write of the session
    # A write under way: the version it writes, and the turns it carries.
    writing: tuple[int, Activity] | None = None


class ActivityLedger:
    """Each session's turns that this process has seen and not yet written, and when it last
    wrote the session (at most `max_sessions`: oldest out; at most `max_turns` turns each)."""

    def __init__(
        self, max_turns: int, write_seconds: float, max_sessions: int = DEFAULT_MAX_SESSIONS
    ) -> None:
        self.max_turns = max_turns
        self.write_seconds = write_seconds
        self.max_sessions = max_sessions
        self._entries: dict[str, _Entry] = {}

    def observe(self, key: str, who: Who, turn: TurnFigures) -> float:
        """Keep one turn; the seconds until the session's turns are due to be written."""
        entry = self._entries.get(key)
        if entry is None:
            make_room(self._entries, key, self.max_sessions)
            entry = self._entries[key] = _Entry(None, -math.inf)
        unwritten = entry.unwritten
        entry.unwritten = (
            Activity.of(who, turn)
            if unwritten is None
            else unwritten.then(who, turn, self.max_turns)
        )
        return max(0.0, entry.written_at + self.write_seconds - time.monotonic())

    def unwritten(self, key: str, version: int | None = None) -> Activity | None:
        """The turns not written yet, but for those a write under way took to `version` (of
        a record read meanwhile): they are in it."""
        entry = self._entries.get(key)
        if entry is None or entry.unwritten is None:
            return None
        if entry.writing is not None and version is not None and version >= entry.writing[0]:
            return entry.unwritten.after(entry.writing[1])
        return entry.unwritten

    def writing(self, key: str, version: int, activity: Activity | None) -> None:
        """A write of the session as `version`, with `activity` as `unwritten` gave it, is
        under way (until `not_writing`)."""
        entry = self._entries.get(key)
        if entry is not None and activity is not None:
            entry.writing = (version, activity)

    def not_writing(self, key: str) -> None:
        entry = self._entries.get(key)
        if entry is not None:
            entry.writing = None

    def sessions(self) -> list[str]:
        """The sessions with turns not written yet."""
        return [key for key, entry in self._entries.items() if entry.unwritten is not None]

    def written(self, key: str, activity: Activity | None) -> None:
        """The session was written, with `activity` as `unwritten` gave it: only the turns
        that came since stay."""
        entry = self._entries.get(key)
        if entry is None:
            return
        entry.written_at = time.monotonic()
        if activity is not None and entry.unwritten is not None:
            entry.unwritten = entry.unwritten.after(activity)

    def forget(self, key: str) -> None:
        self._entries.pop(key, None)
