"""What the proxy keeps per session, and how it is (de)serialised for the store.

A session holds the plans of a few branches of its history (an edited or branched history
gets a plan of its own), a summary prepared ahead of time, the recent decisions, memory
candidates, the calibration of the token counter against the upstream's own counts and what
the upstream's prompt cache read and wrote (`cache_usage`).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import orjson

import policies
from proxy.memo import make_room
from proxy.sessions.cache_usage import CacheUsage

if TYPE_CHECKING:
    from proxy.models.calibration import Counting

MAX_DECISIONS = 50
MAX_MEMORY = 20
MAX_MEMORY_BYTES = 2048


@dataclasses.dataclass(frozen=True)
class Branch:
    """A plan and the chain hash of the history prefix it was computed over."""

    plan: policies.Plan
    chain: str
    used: float
    # The plan's compaction left too little room under the compact level (`Policy.short`; the
    # floor, in tokens: fixed part and current turn): replayed, not redone, while it fits.
    short: int = 0

    def matches(self, chain: policies.Chain) -> bool:
        return self.plan.covered == 0 or chain.prefix(self.plan.covered) == self.chain


@dataclasses.dataclass(frozen=True)
class Prepared:
    """An LLM summary made ahead of time: chain positions [start, end) rolled into the summary
    that stood for [0, start) (identified by its text's hash)."""

    start: int
    end: int
    chain: str
    base: str
    text: str


@dataclasses.dataclass(frozen=True)
class SessionState:
    branches: tuple[Branch, ...] = ()
    prepared: Prepared | None = None
    decisions: tuple[dict[str, Any], ...] = ()
    memory: tuple[dict[str, Any], ...] = ()
    calibration: float | None = None
    pending: str | None = None  # a manual compaction asked for: its instructions ("" = none)
    prompt_cache: CacheUsage | None = None
    # The name of the `Counting` the calibration was learnt for; None in a record of a version
    # that did not say, whose ratio may be any model's: no request takes it.
    calibrated_for: str | None = None

    def ratio_for(self, counting: Counting) -> float | None:
        """The calibration, when it was learnt for `counting`."""
        return self.calibration if self.calibrated_for == counting.name else None

    def with_calibration(self, ratio: float | None, counting: Counting) -> SessionState:
        """The ratio learnt for `counting` in place of the stored one (None: none learnt)."""
        if ratio is None:
            return self
        return dataclasses.replace(self, calibration=ratio, calibrated_for=counting.name)

    def branch(self, chain: policies.Chain) -> Branch | None:
        """The branch that covers the longest prefix of this history."""
        found = [b for b in self.branches if b.matches(chain)]
        return max(found, key=lambda b: b.plan.covered, default=None)

    def with_branch(self, branch: Branch, chain: policies.Chain, max_branches: int) -> SessionState:
        """`branch`, computed over `chain`, replaces every branch that is a prefix of that
        history (it grew from them); the other branches stay, least recently used out."""
        others = [b for b in self.branches if not b.matches(chain)]
        others.sort(key=lambda b: b.used, reverse=True)
        return dataclasses.replace(self, branches=(branch, *others[: max(0, max_branches - 1)]))

    def with_decisions(self, decisions: Sequence[dict[str, Any]]) -> SessionState:
        merged = (*self.decisions, *decisions)[-MAX_DECISIONS:]
        return dataclasses.replace(self, decisions=merged)

    def with_memory(self, candidates: Sequence[dict[str, Any]]) -> SessionState:
        seen = {m["text"] for m in candidates}
        kept = [m for m in self.memory if m["text"] not in seen]
        merged = [*kept, *(_capped(c) for c in candidates)][-MAX_MEMORY:]
        return dataclasses.replace(self, memory=tuple(merged))

    def to_dict(self) -> dict[str, Any]:
        """Plain data: what is stored, and what the admin API shows (`calibrated_for` only
        when known: the record stays as the versions before it wrote it)."""
        calibrated = {} if self.calibrated_for is None else {"calibrated_for": self.calibrated_for}
        return {
            "branches": [
                {"plan": b.plan.to_dict(), "chain": b.chain, "used": b.used}
                | ({"short": b.short} if b.short else {})
                for b in self.branches
            ],
            "prepared": dataclasses.asdict(self.prepared) if self.prepared else None,
            "decisions": self.decisions,
            "memory": self.memory,
            "calibration": self.calibration,
            "pending": self.pending,
            "prompt_cache": self.prompt_cache.to_dict() if self.prompt_cache else None,
        } | calibrated

    def to_bytes(self) -> bytes:
        return orjson.dumps({"v": 1, **self.to_dict()}, option=orjson.OPT_NON_STR_KEYS)

    @classmethod
    def from_bytes(cls, data: bytes) -> SessionState:
        """The state of `to_bytes`; ValueError for anything else (a corrupt record), checked
        field by field so that a state read from the store cannot fail a request later."""
        try:
            raw = orjson.loads(data)
            prepared = raw.get("prepared")
            calibration = raw.get("calibration")
            prompt_cache = raw.get("prompt_cache")
            state = cls(
                branches=tuple(
                    Branch(
                        policies.Plan.from_dict(b["plan"]),
                        str(b["chain"]),
                        float(b["used"]),
                        int(b.get("short", 0)),
                    )
                    for b in _expect(raw["branches"], list)
                ),
                prepared=_checked_prepared(Prepared(**prepared)) if prepared else None,
                decisions=tuple(_expect(d, dict) for d in raw.get("decisions") or ()),
                memory=tuple(_expect(m, dict) for m in raw.get("memory") or ()),
                calibration=None if calibration is None else _ratio(calibration),
                pending=_optional(raw.get("pending"), str),
                prompt_cache=CacheUsage.from_dict(prompt_cache) if prompt_cache else None,
                calibrated_for=_optional(raw.get("calibrated_for"), str),
            )
            for memory in state.memory:
                _expect(memory.get("text"), str)
        except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"not a session state: {type(exc).__name__}") from None
        return state


T = TypeVar("T")


def _expect(value: Any, kind: type[T]) -> T:
    if not isinstance(value, kind):
        raise TypeError(f"expected {kind.__name__}")
    return value


def _optional(value: Any, kind: type[T]) -> T | None:
    return None if value is None else _expect(value, kind)


def _ratio(value: Any) -> float:
    if type(value) not in (int, float) or not 0 < value < math.inf:
        raise TypeError("a calibration is a positive number")
    return float(value)


def _checked_prepared(prepared: Prepared) -> Prepared:
    for name in ("start", "end"):
        _expect(getattr(prepared, name), int)
    for name in ("chain", "base", "text"):
        _expect(getattr(prepared, name), str)
    return prepared


def _capped(candidate: dict[str, Any]) -> dict[str, Any]:
    text = str(candidate["text"]).encode()[:MAX_MEMORY_BYTES].decode(errors="ignore")
    return {**candidate, "text": text}


def decision_record(decision: policies.Decision, *, shadow: bool) -> dict[str, Any]:
    """What the session keeps of a layer's decision; `shadow`: it was computed and stored,
    but the request went upstream unchanged (shadow mode)."""
    return {"at": round(time.time(), 3), **dataclasses.asdict(decision), "shadow": shadow}


class ParsedStates:
    """The state last read of each of the `size` sessions read last, by its record's bytes.

    Between compactions every turn of a session reads the record the turn before read
    (nothing was written since), and parsing it again is the largest part of loading it (a
    plan of 200 edits: 0.12 ms, and the garbage of them). A state is immutable, so one serves
    every turn that reads the same bytes; other bytes are parsed and take its place."""

    def __init__(self, size: int = 64) -> None:
        self.size = size
        self._states: dict[str, tuple[bytes, SessionState]] = {}

    def parse(self, key: str, data: bytes) -> SessionState:
        """`SessionState.from_bytes(data)`, the same as last time for the same bytes."""
        found = self._states.pop(key, None)  # put back last: the most recently read
        if found is None or found[0] != data:
            found = (data, SessionState.from_bytes(data))
        make_room(self._states, key, self.size)
        self._states[key] = found
        return found[1]
