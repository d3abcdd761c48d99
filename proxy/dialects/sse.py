"""Server-sent events, as the APIs stream their answers: the data of each event."""

from __future__ import annotations

import re

_EVENT_END = re.compile(rb"\r?\n\r?\n")


class EventStream:
    """The data of each event of an SSE body read chunk by chunk: its `data:` lines joined
    (an event without data, such as a comment, has none)."""

    def __init__(self) -> None:
        self._rest = b""

    def feed(self, chunk: bytes) -> list[bytes]:
        """The data of the events that `chunk` completes."""
        *complete, self._rest = _EVENT_END.split(self._rest + chunk)
        return [data for event in complete if (data := _data(event))]


def _data(event: bytes) -> bytes:
    lines = event.splitlines()
    return b"\n".join(line[5:].strip() for line in lines if line.startswith(b"data:"))
