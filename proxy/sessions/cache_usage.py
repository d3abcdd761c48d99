"""What the upstream's prompt cache did for a session: its last answer's figures and its
totals (prompt tokens, of which read from the cache and written to it), from the usage the
proxy reads anyway for calibration (Anthropic's `cache_read_input_tokens` and
`cache_creation_input_tokens`, OpenAI's `cached_tokens`).

Usage comes with the end of an answer, when there is nothing to write the session for: a
write of its own would add a store round trip to every request. The figures are kept in this
process instead (`CacheLedger`) and go to the store with the session's next write (a
compaction, a summary prepared ahead of time, an admin call), the write that also carries the
calibration: `Sessions.update` folds them in. The admin view adds this process's figures not
written yet to those stored.
"""

from __future__ import annotations

import dataclasses
import math
import operator
import struct
import time
from typing import Any

from proxy.dialects import Usage
from proxy.memo import DEFAULT_MAX_SESSIONS, make_room

# A session's unwritten figures as the ledger holds them: `at`, then the last answer's and the
# totals, packed in 105 bytes where the objects took about 450 (bench/README.md, "Memory").
_PACKED = struct.Struct("<d8q")


@dataclasses.dataclass(frozen=True, slots=True)
class CacheFigures:
    """Prompt tokens of some answers, and how many of them the prompt cache read and wrote."""

    requests: int = 0
    prompt_tokens: int = 0
    cache_read_tokens: int = 0
    cache_creation_tokens: int = 0

    def __add__(self, other: CacheFigures) -> CacheFigures:
        return CacheFigures(*(a + b for a, b in zip(_values(self), _values(other), strict=True)))

    def __sub__(self, other: CacheFigures) -> CacheFigures:
        return CacheFigures(*(a - b for a, b in zip(_values(self), _values(other), strict=True)))

    @property
    def read_share(self) -> float | None:
        """The share of the prompt tokens read from the cache."""
        if self.prompt_tokens <= 0:
            return None
        return round(self.cache_read_tokens / self.prompt_tokens, 4)

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "read_share": self.read_share}

    @classmethod
    def from_dict(cls, raw: Any) -> CacheFigures:
        """TypeError unless every figure is a count."""
        figures = [raw.get(f.name, 0) for f in dataclasses.fields(cls)]
        if any(type(v) is not int or v < 0 for v in figures):
            raise TypeError("cache figures are counts")
        return cls(*figures)


@dataclasses.dataclass(frozen=True, slots=True)
class CacheUsage:
    """A session's prompt-cache figures: its last answer's, when it came, and the totals."""

    last: CacheFigures
    at: float  # when the last answer's usage was read (seconds since the epoch)
    total: CacheFigures

    def plus(self, other: CacheUsage | None) -> CacheUsage:
        """Both added up; the later of the two last answers."""
        if other is None:
            return self
        newer = other if other.at >= self.at else self
        return CacheUsage(newer.last, newer.at, self.total + other.total)

    def to_dict(self) -> dict[str, Any]:
        last = self.last.to_dict()
        del last["requests"]
        return {"last": {"at": self.at, **last}, "total": self.total.to_dict()}

    @classmethod
    def from_dict(cls, raw: Any) -> CacheUsage:
        """TypeError or KeyError unless it is one of `to_dict`."""
        at = raw["last"]["at"]
        if type(at) not in (int, float) or not math.isfinite(at):
            raise TypeError("a time is a finite number")
        last = CacheFigures.from_dict({**raw["last"], "requests": 1})
        return cls(last, float(at), CacheFigures.from_dict(raw["total"]))


class CacheLedger:
    """Each session's figures that this process has read and not yet written (at most
    `max_sessions`: oldest out)."""

    def __init__(self, max_sessions: int = DEFAULT_MAX_SESSIONS) -> None:
        self.max_sessions = max_sessions
        self._unwritten: dict[str, bytes] = {}

    def observe(self, key: str, usage: Usage) -> None:
        # Packed as `_packed` packs them: this answer's figures are the last, and add to the
        # totals (on every answer: without making the objects).
        last = (1, usage.prompt_tokens, usage.cached_tokens or 0, usage.cache_creation_tokens or 0)
        old = self._unwritten.pop(key, None)
        make_room(self._unwritten, key, self.max_sessions)
        total = last if old is None else map(operator.add, _PACKED.unpack(old)[5:], last)
        self._unwritten[key] = _PACKED.pack(time.time(), *last, *total)

    def unwritten(self, key: str) -> CacheUsage | None:
        found = self._unwritten.get(key)
        return None if found is None else _unpacked(found)

    def forget(self, key: str) -> None:
        self._unwritten.pop(key, None)

    def written(self, key: str, usage: CacheUsage) -> None:
        """`usage`, as `unwritten` gave it, was written: only what came since stays."""
        now = self.unwritten(key)
        if now is None:
            return
        rest = now.total - usage.total
        if rest.requests <= 0:
            del self._unwritten[key]
        else:
            self._unwritten[key] = _packed(CacheUsage(now.last, now.at, rest))


def _packed(usage: CacheUsage) -> bytes:
    return _PACKED.pack(usage.at, *_values(usage.last), *_values(usage.total))


def _unpacked(data: bytes) -> CacheUsage:
    at, *figures = _PACKED.unpack(data)
    return CacheUsage(CacheFigures(*figures[:4]), at, CacheFigures(*figures[4:]))


def _values(figures: CacheFigures) -> tuple[int, ...]:
    return (
        figures.requests,
        figures.prompt_tokens,
        figures.cache_read_tokens,
        figures.cache_creation_tokens,
    )
