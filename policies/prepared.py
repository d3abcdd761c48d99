"""A summary prepared ahead of time, standing for more than it covers.

A summary made in the background covers chain positions [start, end). The compaction that
uses it may evict more: the rest is covered on that very turn, by a digest beside it when
there is room for one within the summary's cap, else by folding the rest into it (the
request the summarizer is asked instead, with the prepared summary as the previous one).
Nothing the cut removes is left out of what replaces it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from policies.counting import Counter
from policies.digest import digest
from policies.summary import Summary, SummaryRequest

MIN_TAIL_TOKENS = 48  # a digest of the rest in less tells too little of it: fold it in


@dataclass(frozen=True)
class Rolled:
    """What stands for a summary request: the prepared summary and, beside it, a digest of
    the positions (`digested`) it does not cover."""

    text: str
    digested: tuple[int, ...]


def roll_prepared(
    text: str, start: int, end: int, request: SummaryRequest, counter: Counter
) -> Rolled | SummaryRequest:
    """The summary `text` covering [start, end), made to stand for all of `request`'s
    evicted messages: with a digest of the others beside it, or the request that folds them
    into it."""
    rest = [
        (message, position)
        for message, position in zip(request.evicted, request.positions, strict=True)
        if not start <= position < end
    ]
    if not rest:
        return Rolled(text, ())
    positions = tuple(position for _, position in rest)
    room = request.max_tokens - counter.text(text) - 2
    if room < MIN_TAIL_TOKENS:
        return replace(
            request,
            previous=Summary(text, "llm"),
            evicted=[message for message, _ in rest],
            positions=positions,
            start=end,
        )
    tail = digest(None, [message for message, _ in rest], max_tokens=room, counter=counter)
    return Rolled(f"{text}\n\n{tail}" if tail else text, positions)
