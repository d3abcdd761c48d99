"""Text as lines, compressed to a budget: errors and failures whole (tracebacks too) with a
little context, warnings, then the head and the tail; runs of a repeated line collapsed with
their count; what is left out marked where it was (middle-out, never the head alone).
"""

from __future__ import annotations

import operator
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import groupby

from policies.compress.findings import finding_indices
from policies.compress.limits import Limits
from policies.compress.salience import block_end, error_lines, warning_lines

REPEATED = "[previous line repeated {n} more times]"
GAP = "[\u2026 {n} lines elided \u2026]"
GAP_COST = 28  # what a gap's note costs, reserved per gap before the head and tail are chosen
CONTEXT_CHARS = 300  # a context line longer than this keeps its two ends
MIN_PIECE = 40  # a line is not cut down to less than this to fill what is left


@dataclass(frozen=True)
class Shrunk:
    """A compressed body and what it left out (for the marker; "" when nothing)."""

    body: str
    elided: str


def middle_out(text: str, chars: int) -> str:
    """`text` in about `chars` characters: its head and its tail around a note of the cut."""
    if len(text) <= chars:
        return text
    note = f" \u2026[{len(text) - chars} chars elided]\u2026 "
    keep = max(0, chars - len(note))
    head = (keep + 1) // 2
    return f"{text[:head]}{note}{text[len(text) - (keep - head) :]}"


class _Runs:
    """The lines as runs of one repeated line (a run of 1 where collapsing would not save)."""

    def __init__(self, lines: list[str]) -> None:
        self.texts: list[str] = []
        self.counts: list[int] = []
        if not any(map(operator.eq, lines, lines[1:])):  # the common case: no repeats
            self.texts, self.counts = lines, [1] * len(lines)
            self.of_line = list(range(len(lines)))
            return
        self.of_line = []
        for line, group in groupby(lines):
            count = sum(1 for _ in group)
            # Collapsing a short line's short run would not save: its lines stay runs of 1.
            runs = 1 if (len(line) + 1) * (count - 1) > len(REPEATED) + 4 else count
            for _ in range(runs):
                self.of_line += [len(self.texts)] * (count // runs)
                self.texts.append(line)
                self.counts.append(count // runs)

    def __len__(self) -> int:
        return len(self.texts)

    def cost(self, run: int, shown: str) -> int:
        repeated = len(REPEATED) + 4 if self.counts[run] > 1 else 0
        return len(shown) + 1 + repeated

    def render(self, keep: dict[int, str]) -> tuple[str, int]:
        """The kept runs in order, each gap as a note; and the lines left out."""
        out: list[str] = []
        gap = elided = 0
        for run in range(len(self.texts)):
            shown = keep.get(run)
            if shown is None:
                gap += self.counts[run]
                continue
            if gap:
                out.append(GAP.format(n=gap))
                elided, gap = elided + gap, 0
            out.append(shown)
            if self.counts[run] > 1:
                out.append(REPEATED.format(n=self.counts[run] - 1))
        if gap:
            out.append(GAP.format(n=gap))
            elided += gap
        return "\n".join(out), elided


def collapse_repeats(text: str) -> Shrunk | None:
    """The lossless form: runs of a repeated line collapsed with their count (None when there
    are none worth collapsing)."""
    runs = _Runs(text.split("\n"))
    if all(count == 1 for count in runs.counts):
        return None
    body, _ = runs.render(dict(enumerate(runs.texts)))
    return Shrunk(body, "")


def compress_lines(text: str, budget: int, limits: Limits) -> Shrunk:
    """`text` in about `budget` characters (more when its errors alone take more: they are
    never cut)."""
    lines = text.split("\n")
    runs = _Runs(lines)
    salient: set[int] = set()
    blocks = []
    for line in error_lines(text):
        if line in salient:
            continue
        end = block_end(lines, line)
        salient.update(range(line, end))
        blocks.append((line, end))
    salient.update(finding_indices(lines))  # what the output found: kept like its errors
    warnings = [w for w in warning_lines(text, lines) if w not in salient]
    # Warnings count by their distinct runs: a repeated warning is one.
    kept_warnings = list(dict.fromkeys(runs.of_line[w] for w in warnings))[: limits.warning_lines]
    keep = {runs.of_line[i]: runs.texts[runs.of_line[i]] for i in salient}
    keep.update((run, runs.texts[run]) for run in kept_warnings)
    around = limits.context_lines
    context = {
        runs.of_line[i]
        for start, end in blocks
        for i in (*range(start - around, start), *range(end, end + around))
        if 0 <= i < len(lines)
    } - keep.keys()
    shown_context = {run: middle_out(runs.texts[run], CONTEXT_CHARS) for run in context}
    used = _cost(runs, keep) + GAP_COST * (len(blocks) + len(kept_warnings) + 1)
    if used + _cost(runs, shown_context) <= budget:
        keep.update(shown_context)
        used += _cost(runs, shown_context)
    room = max(0, budget - used)
    left = _fill(runs, keep, range(len(runs)), room // 2)
    _fill(runs, keep, reversed(range(len(runs))), room - room // 2 + left)
    body, elided = runs.render(keep)
    shortened = sum(shown != runs.texts[run] for run, shown in keep.items())
    notes = [f"{elided} of {len(lines)} lines"] if elided else []
    if shortened:
        notes.append(f"the middle of {shortened} long lines")
    return Shrunk(body, ", ".join(notes))


def _cost(runs: _Runs, keep: dict[int, str]) -> int:
    return sum(runs.cost(run, shown) for run, shown in keep.items())


def _fill(runs: _Runs, keep: dict[int, str], order: Iterable[int], room: int) -> int:
    """Keep runs in `order` while they fit in `room` (the last one cut down to what is left);
    returns what is left of the room."""
    for run in order:
        if run in keep:
            continue
        text = runs.texts[run]
        cost = runs.cost(run, text)
        if cost > room:
            piece = room - (cost - len(text))
            if piece >= MIN_PIECE:
                keep[run] = middle_out(text, piece)
                room -= runs.cost(run, keep[run])
            break
        keep[run] = text
        room -= cost
    return room
