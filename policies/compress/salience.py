"""What in a tool output must survive compression: error and failure lines, warnings, and the
blocks (tracebacks, stack traces) that follow them.

Searched in the whole text at once, lowercased and without word boundaries: a regex that
starts with `\\b` or is case-insensitive is ten times slower over a 100 KB log, and a word
inside another (`ValueError`, `NullPointerException`) is what is wanted here anyway.
"""

from __future__ import annotations

import functools
import re

# Each word costs a scan of the text: those another one covers are left out (`AssertionError`,
# `Uncaught TypeError`, `unhandled exception` hold `error` or `exception`).
ERROR_WORDS = (
    "error",
    "fatal",
    "critical",
    "panic",
    "exception",
    "traceback",
    "fail",
    "denied",
    "refused",
    "timed out",
    "segmentation fault",
    "abort",
)
_ERROR_ANY_CASE = re.compile("|".join(ERROR_WORDS), re.IGNORECASE)
# Test runners' failure lines that name no error: pytest's `E   `, go's `--- FAIL`, jest's
# crosses and bullets.
LINE_STARTS = ("\nE  ", "--- FAIL", "\u2715 ", "\u2717 ", "\u25cf ")
_CROSSES = LINE_STARTS[2:]
SHORT = 2048
WARNING = "warn"
# Lines that continue the block a salient line opened: indented lines (a traceback's frames),
# `at ...` frames, `Caused by:` and `... N more`.
CONTINUATION = re.compile(r"[ \t]|at |Caused by|\.\.\. \d+ more")
TRACEBACK = "Traceback (most recent call last)"
MAX_BLOCK_LINES = 200  # a block that long is not a stack trace but an indented listing


def error_lines(text: str) -> tuple[int, ...]:
    """The indices of the lines of `text` that hold an error or failure, in order."""
    return _scanned(text)[0]


def has_warning(text: str) -> bool:
    return _scanned(text)[1]


def warning_lines(text: str, lines: list[str]) -> list[int]:
    """The indices of the `lines` of `text` that hold a warning."""
    if not has_warning(text):  # most outputs: one search, no lowercasing a line
        return []
    return [i for i, line in enumerate(lines) if WARNING in line.lower()]


@functools.lru_cache(maxsize=8)
def _scanned(text: str) -> tuple[tuple[int, ...], bool]:
    """`error_lines(text)` and `has_warning(text)`, from one lowercased copy. Cached: telling
    an output's kind and compressing it both need them (a str keeps its hash, so looking a
    100 KB text up again costs nothing)."""
    low = text.lower()
    offsets = _word_offsets(text, low)
    for marker in LINE_STARTS:
        at = text.find(marker)
        while at >= 0:
            offsets.append(at + 1 if marker[0] == "\n" else at)
            at = text.find(marker, at + 1)
    if text.startswith(LINE_STARTS[0][1:]):
        offsets.append(0)
    # An offset's line is the newlines before it, counted in C from the offset before: the
    # text is not split into its lines.
    found: dict[int, None] = {}
    line = at = 0
    for offset in sorted(set(offsets)):
        line += text.count("\n", at, offset)
        at = offset
        found[line] = None
    return tuple(found), WARNING in low


def block_end(lines: list[str], start: int) -> int:
    """The end (exclusive) of the block the salient line at `start` opens: a Python traceback
    up to and with its exception line, else the continuation lines after it."""
    end = start + 1
    limit = min(len(lines), start + MAX_BLOCK_LINES)
    while end < limit and lines[end] and CONTINUATION.match(lines[end]):
        end += 1
    if TRACEBACK in lines[start] and end < limit:
        end += 1  # the exception line, not indented, ends a Python traceback
    return end


def is_salient_text(text: str) -> bool:
    """Whether `text` holds an error or a failure."""
    if "--- FAIL" in text or "\nE  " in text or any(mark in text for mark in _CROSSES):
        return True
    if len(text) < SHORT:  # one regex beats a scan a word (a JSON value, a record)
        return _ERROR_ANY_CASE.search(text) is not None
    low = text.lower()
    if len(low) != len(text):
        return _ERROR_ANY_CASE.search(text) is not None
    return any(word in low for word in ERROR_WORDS)


def error_offsets(text: str) -> list[int]:
    """The offsets of the error words in `text`."""
    return _word_offsets(text, text.lower())


def _word_offsets(text: str, low: str) -> list[int]:
    # Lowercasing keeps offsets unless a character lowercases to several (rare: then the
    # slower case-insensitive search, on the text itself).
    if len(low) != len(text):
        return [match.start() for match in _ERROR_ANY_CASE.finditer(text)]
    found = []
    for word in ERROR_WORDS:
        at = low.find(word)
        while at >= 0:
            found.append(at)
            at = low.find(word, at + len(word))
    return found
