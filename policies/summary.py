"""Summaries of evicted history and the interface of the injected summarizer."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal

from policies.message import Message

SummaryKind = Literal["llm", "digest"]


@dataclass(frozen=True)
class Summary:
    """Text standing for the evicted prefix: an LLM summary or a mechanical digest."""

    text: str
    kind: SummaryKind


@dataclass(frozen=True)
class SummaryRequest:
    """What the summarizer is asked: roll `evicted` into `previous`, in `max_tokens` at most.

    `evicted` are the newly evicted messages as they looked in the view, media parts as
    `[image]`-like labels; `positions` their chain positions, within [start, end), the chain
    range this summary will stand for together with `previous` (which stood for [0, start)).
    """

    previous: Summary | None
    evicted: list[Message]
    max_tokens: int
    instructions: str | None
    start: int = 0
    end: int = 0
    positions: tuple[int, ...] = ()


Summarizer = Callable[[SummaryRequest], Awaitable[str]]
