"""Summaries of evicted history and the interface of the injected summarizer."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal

from policies.message import Message

SummaryKind = Literal["llm", "digest"]


TAIL_HEADING = "[Digest of the messages after that summary, extracted mechanically:]"


@dataclass(frozen=True)
class Summary:
    """Text standing for the evicted prefix: an LLM summary or a mechanical digest.

    `tail` is a digest of what was evicted after an LLM summary while the summarizer failed:
    the summary stays as it was, and the next LLM summary rolls the tail in.
    """

    text: str
    kind: SummaryKind
    tail: str | None = None

    @property
    def shown(self) -> str:
        """What the view shows of it."""
        return self.text if self.tail is None else f"{self.text}\n\n{TAIL_HEADING}\n{self.tail}"


@dataclass(frozen=True)
class SummaryRequest:
    """What the summarizer is asked: roll `evicted` into `previous`, in `max_tokens` at most.

    `evicted` are the newly evicted messages as the client sent them, media parts as
    `[image]`-like labels; `positions` their chain positions: those of [start, end) but an
    agent loop's task kept verbatim, and a task kept before `start` that no longer is. The
    summary stands for them together with `previous` (which stood for [0, start)).
    """

    previous: Summary | None
    evicted: list[Message]
    max_tokens: int
    instructions: str | None
    start: int = 0
    end: int = 0
    positions: tuple[int, ...] = ()


Summarizer = Callable[[SummaryRequest], Awaitable[str]]


# A summary allowed fewer tokens for more than this many times as much history says next to
# nothing (a target squeezed by a large max_tokens): no call is made, the digest stands in.
MIN_SUMMARY_TOKENS = 128
MAX_SQUEEZE = 4


def too_short(request: SummaryRequest, count: Callable[[Message], int]) -> bool:
    """Whether `request`'s cap is too small for what it evicts to be worth a summarizer's
    call (a choice, not a failure: the digest stands in)."""
    if request.max_tokens >= MIN_SUMMARY_TOKENS:
        return False
    return sum(map(count, request.evicted)) > request.max_tokens * MAX_SQUEEZE
