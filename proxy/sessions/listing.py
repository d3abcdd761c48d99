"""A session's row in the list of recent sessions: what the dashboard's list shows of it,
made at each write of its turns (`turn_log`) and kept in the store's index (`recent`), no
message text in it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import orjson

from proxy.sessions.activity import Activity
from proxy.sessions.cache_usage import CacheUsage
from proxy.sessions.state import SessionState


@dataclasses.dataclass(frozen=True)
class Listed:
    key: str
    version: int  # of the session's state when it was made; 0: none
    at: float = 0.0  # the last turn's time
    tenant: str = ""
    api: str = ""
    model: str = ""
    policy: str = ""
    store: str = "ok"  # the store as the last turn found it
    turns: int = 0
    compactions: int = 0
    saved: int = 0  # tokens, in all
    sent: int = 0  # the last turn's tokens
    forwarded: int = 0
    action: str = ""
    prompt_tokens: int = 0  # of the answers that reported their usage, in all
    cache_read_tokens: int = 0
    prepared: bool = False  # a summary prepared ahead waits for the next compaction
    pending: bool = False  # a compaction asked for through the admin API

    @classmethod
    def of(cls, key: str, version: int, state: SessionState, activity: Activity) -> Listed:
        """The row of a session's state and turns."""
        prepared, pending = state.prepared is not None, state.pending is not None
        row = cls(key, version, prepared=prepared, pending=pending)
        return row.plus(activity, state.prompt_cache)

    def plus(self, activity: Activity | None, cache: CacheUsage | None) -> Listed:
        """The row with turns and prompt-cache figures that came after it."""
        row = self
        if activity is not None and activity.last is not None:
            last = activity.last
            who = activity.who
            row = dataclasses.replace(
                row,
                tenant=who.tenant,
                api=who.api,
                model=who.model,
                policy=who.policy,
                store=who.store,
                at=round(last.at, 3),  # as the turns are stored
                turns=row.turns + activity.counts.turns,
                compactions=row.compactions + activity.counts.compactions,
                saved=row.saved + activity.counts.saved,
                sent=last.sent,
                forwarded=last.forwarded,
                action=last.action,
            )
        if cache is not None:
            row = dataclasses.replace(
                row,
                prompt_tokens=row.prompt_tokens + cache.total.prompt_tokens,
                cache_read_tokens=row.cache_read_tokens + cache.total.cache_read_tokens,
            )
        return row

    def to_dict(self) -> dict[str, Any]:
        """What the dashboard's list shows, the prompt cache's read share with it."""
        share = self.cache_read_tokens / self.prompt_tokens if self.prompt_tokens else None
        return {**dataclasses.asdict(self), "cache_read_share": share}

    def to_bytes(self) -> bytes:
        return orjson.dumps([getattr(self, name) for name in _NAMES])

    @classmethod
    def from_bytes(cls, data: bytes) -> Listed:
        """The row of `to_bytes`; ValueError for anything else."""
        try:
            row = cls(*orjson.loads(data))
        except (orjson.JSONDecodeError, TypeError) as exc:
            raise ValueError(f"not a listed session: {type(exc).__name__}") from None
        for field in dataclasses.fields(cls):
            if type(getattr(row, field.name)).__name__ not in _TYPES[str(field.type)]:
                raise ValueError(f"not a listed session: {field.name}")
        return row


_NAMES = tuple(field.name for field in dataclasses.fields(Listed))
# The JSON types of a row's fields (a time may have been written without its fraction).
_TYPES = {"str": ("str",), "int": ("int",), "float": ("float", "int"), "bool": ("bool",)}
