"""Per-session figures a process keeps for itself (calibration, exact counts, prompt-cache
figures not yet written), each bounded in number by `store.max_sessions`: oldest out."""

from __future__ import annotations

from typing import Any

from .config import Store

DEFAULT_MAX_SESSIONS = Store.max_sessions


def make_room(entries: dict[str, Any], key: str, max_sessions: int) -> None:
    """Before `key` is put in `entries`: if it is new and they are full, the oldest goes."""
    if key not in entries and len(entries) >= max_sessions:
        del entries[next(iter(entries))]
