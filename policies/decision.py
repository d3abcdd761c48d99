"""What a layer did, for logs, headers and the admin API: positions, never message text."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Decision:
    """One layer's change: the chain positions it touched and the view's tokens around it."""

    layer: str
    positions: tuple[int, ...]
    tokens_before: int
    tokens_after: int
    detail: str = ""
