"""The figures of one turn of a session, as the dashboard charts them, and a session's last
turns as its record keeps them: lines of text, one a turn.

Every request reads its session's record, and a session's turns are written at most every
few seconds, each time with a few more: so they are kept as text, which a request's read
leaves as it is, a write appends to and cuts at its end (`Turns.then`), and only the
dashboard makes into figures, each line by itself.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, NamedTuple, overload

import orjson

log = logging.getLogger("compaction_proxy")

COMPACTIONS = ("compacted", "degraded")


class TurnFigures(NamedTuple):
    """One turn, in the token counter's tokens (a tuple: one is made on every request)."""

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


@dataclasses.dataclass(frozen=True)
class TurnCounts:
    """A session's turns, compactions and tokens saved, in all."""

    turns: int = 0
    compactions: int = 0
    saved: int = 0

    def __add__(self, other: TurnCounts) -> TurnCounts:
        return TurnCounts(
            self.turns + other.turns,
            self.compactions + other.compactions,
            self.saved + other.saved,
        )


@dataclasses.dataclass(frozen=True)
class StoredTurns:
    """What a session's record keeps of its turns, beside its state: the last turn's `Who`
    (JSON), the counts of all, and the last turns' lines (`Turns.text`). Written, its counts
    and lines are added to those kept."""

    who: bytes
    counts: TurnCounts
    lines: str

    def then(self, added: StoredTurns, keep: int) -> StoredTurns:
        """These and `added` after them, as a store adds them (`SessionStore.add_turns`)."""
        lines = f"{self.lines}\n{added.lines}" if self.lines else added.lines
        kept = "\n".join(lines.split("\n")[-keep:])
        return StoredTurns(added.who, self.counts + added.counts, kept)


NO_TURNS = StoredTurns(b"", TurnCounts(), "")


class Turns(Sequence[TurnFigures]):
    """A session's last turns, oldest first: `text` holds one `TurnFigures.to_list` a line,
    made into figures when first read; a line that is not a turn is left out (it must fail
    neither a request nor the session's next write)."""

    __slots__ = ("_figures", "text")

    def __init__(self, text: str = "") -> None:
        self.text = text
        self._figures: tuple[TurnFigures, ...] | None = None

    @classmethod
    def of(cls, turns: Iterable[TurnFigures]) -> Turns:
        return cls("\n".join(_line(turn) for turn in turns))

    def then(self, later: Sequence[TurnFigures], max_turns: int) -> Turns:
        """These, and turns that came after them: the last `max_turns`."""
        lines = [*self._lines(), *map(_line, later)]
        return Turns("\n".join(lines[-max_turns:]))

    @property
    def last(self) -> TurnFigures | None:
        """The last turn (its line alone read)."""
        if self._figures is None and self.text:
            found = _read(self.text.rpartition("\n")[2])
            if found is not None:
                return found
        figures = self._read()
        return figures[-1] if figures else None

    def _lines(self) -> list[str]:
        return self.text.split("\n") if self.text else []

    def _read(self) -> tuple[TurnFigures, ...]:
        if self._figures is None:
            read = (_read(line) for line in self._lines())
            self._figures = tuple(turn for turn in read if turn is not None)
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


def _line(turn: TurnFigures) -> str:
    return orjson.dumps(turn.to_list()).decode()


def _read(line: str) -> TurnFigures | None:
    try:
        return TurnFigures.from_list(orjson.loads(line))
    except (orjson.JSONDecodeError, TypeError):
        log.warning("a corrupt turn of a session left out")
        return None
