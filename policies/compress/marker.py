"""The marker a compressed tool output begins with: that it is one, of what kind, how large the
original was and what was elided.

It is one bracketed line of `key: value` fields separated by "; ", so that a later feature can
add fields (a `handle=...` to fetch the original) and read them back with `Marker.parse`:

    [compressed tool output: log, 102400 chars; elided: 3058 of 3120 lines]
    [compressed tool output: log, 102400 chars; elided: 3058 of 3120 lines; handle=abc123]
"""

from __future__ import annotations

import re
from dataclasses import dataclass

PREFIX = "[compressed tool output: "
_FORM = re.compile(
    r"\[compressed tool output: (?P<kind>[a-z]+), (?P<chars>\d+) chars"
    r"(?:; elided: (?P<elided>[^;\]]*))?(?:; handle=(?P<handle>[^;\]\s]+))?\]"
)


@dataclass(frozen=True)
class Marker:
    """`kind` is the compressor's (json, log, search, diff, html, blob, text), `chars` the
    original's length, `elided` what was left out ("" when the form is lossless), `handle`
    where the original can be fetched (None: nowhere yet)."""

    kind: str
    chars: int
    elided: str = ""
    handle: str | None = None

    def render(self) -> str:
        fields = [f"{PREFIX}{self.kind}, {self.chars} chars"]
        if self.elided:
            fields.append(f"elided: {self.elided}")
        if self.handle is not None:
            fields.append(f"handle={self.handle}")
        return "; ".join(fields) + "]"

    @classmethod
    def parse(cls, text: str) -> Marker | None:
        """The first marker in `text` (None when there is none)."""
        found = _FORM.search(text)
        if found is None:
            return None
        return cls(
            found["kind"], int(found["chars"]), found["elided"] or "", found["handle"] or None
        )
