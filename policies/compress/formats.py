"""Search results, diffs, HTML and blobs: detected by their shape, each compressed its own way.

- search/grep results (`path:line:text`): grouped by file, the path said once (lossless); then
  fewer matches per file, the salient ones kept;
- unified diffs: file and hunk headers with the changed lines, context lines left out; then
  fewer changed lines per hunk;
- HTML: its text;
- base64 and minified runs inside any text: elided with their size.
"""

from __future__ import annotations

import functools
import html
import re
from collections.abc import Iterator

from policies.compress.limits import Limits
from policies.compress.lines import Shrunk, compress_lines
from policies.compress.salience import is_salient_text

# A path has a slash or an extension, and no spaces (a timestamp's `10:00:00` is no match).
SEARCH_LINE = re.compile(
    r"(?P<path>[^\s:]*(?:/|\.[A-Za-z])[^\s:]*):(?P<line>\d+)(?P<sep>[:-])(?P<text>.*)"
)
DIFF = re.compile(r"^(?:diff --git |--- \S|\+\+\+ \S)", re.MULTILINE)
HUNK = re.compile(r"^@@ -\d", re.MULTILINE)
HTML = re.compile(r"\s*(?:<!doctype html|<html|<head|<body)", re.IGNORECASE)
_HIDDEN = re.compile(r"<(script|style|noscript|template|svg)\b.*?</\1\s*>|<!--.*?-->", re.I | re.S)
_BREAK = re.compile(
    r"<(?:br|/p|/div|/li|/tr|/h[1-6]|/title|/section|/article|/header|/footer|/table|/ul|/ol|"
    r"/pre|/blockquote|/dt|/dd)\b[^>]*>",
    re.IGNORECASE,
)
_TAG = re.compile(r"<[^>]*>")
_DATA_URL = re.compile(r"data:[\w/+.-]+;base64,\Z")
_DIFF_KEPT = ("diff ", "--- ", "+++ ", "@@", "new file", "deleted file", "rename ", "Binary ")
# Per-file matches (search) and per-hunk changed lines (diff) at each try, as shares of
# `Limits.items`, until the form fits.
_TRIES = (1.0, 0.5, 0.25, 0.1, 0.0)


def is_search(lines: list[str]) -> bool:
    """Whether nearly every line is a `path:line:text` match (or grep's `--` separator)."""
    content = [line for line in lines if line and line != "--"]
    if len(content) < 3:
        return False
    matching = sum(SEARCH_LINE.fullmatch(line) is not None for line in content)
    return matching >= 0.8 * len(content)


def is_diff(text: str) -> bool:
    return HUNK.search(text) is not None and DIFF.search(text) is not None


def is_html(text: str) -> bool:
    return HTML.match(text) is not None


def grouped(lines: list[str], per_file: int | None) -> tuple[str, int]:
    """A search's matches grouped by file: the path, then its matches as `  line:text`; with
    `per_file`, at most that many of a file's matches besides the salient ones. And how many
    matches were left out."""
    files: dict[str, list[str]] = {}
    other: list[str] = []
    for line in lines:
        found = SEARCH_LINE.fullmatch(line)
        if found is None:
            if line and line != "--":
                other.append(line)
            continue
        match = f"  {found['line']}{found['sep']}{found['text']}"
        files.setdefault(found["path"], []).append(match)
    out = []
    left = 0
    for path, matches in files.items():
        kept, more = _capped(matches, per_file, "matches in this file")
        out += [path, *kept]
        left += more
    return "\n".join([*out, *other]), left


def diff_changes(text: str, per_hunk: int) -> tuple[str, int, int]:
    """The diff's file and hunk headers and changed lines, at most `per_hunk` changed lines a
    hunk; and the context and changed lines left out."""
    out: list[str] = []
    hunk: list[str] = []
    context = 0
    changed = 0

    def close() -> None:
        nonlocal changed
        kept, left = _capped(hunk, per_hunk, "changed lines in this hunk")
        changed += left
        out.extend(kept)
        hunk.clear()

    for line in text.split("\n"):
        if line.startswith(("+", "-")) and not line.startswith(("+++ ", "--- ")):
            hunk.append(line)
        elif line.startswith(_DIFF_KEPT):
            close()
            out.append(line)
        elif line.startswith("index "):
            continue
        else:
            context += 1
    close()
    return "\n".join(out), context, changed


def compress_diff(text: str, budget: int, limits: Limits) -> Shrunk:
    for share in _TRIES:
        body, context, changed = diff_changes(text, round(limits.items * share))
        if len(body) <= budget:
            break
    notes = [f"{context} context lines"]
    if changed:
        notes.append(f"{changed} changed lines")
    return Shrunk(body, ", ".join(notes))


def compress_search(lines: list[str], budget: int, limits: Limits) -> Shrunk:
    for share in _TRIES:
        body, left = grouped(lines, round(limits.items * share))
        if len(body) <= budget:
            return Shrunk(body, f"{left} matches" if left else "")
    # Too many files even with one match each: the grouped lines, middle-out.
    shrunk = compress_lines(body, budget, limits)
    notes = [note for note in (f"{left} matches" if left else "", shrunk.elided) if note]
    return Shrunk(shrunk.body, ", ".join(notes))


def html_text(text: str) -> str:
    """The text of an HTML page: scripts, styles and comments out, a line per block."""
    text = _HIDDEN.sub(" ", text)
    text = _BREAK.sub("\n", text)
    text = html.unescape(_TAG.sub(" ", text))
    lines = (" ".join(line.split()) for line in text.split("\n"))
    return "\n".join(line for line in lines if line)


@functools.lru_cache(maxsize=8)
def _base64(chars: int) -> re.Pattern[str]:
    # The lookbehind starts a match only where a run starts (else every position inside a run
    # of word characters is tried again); a data URL's head is found apart, for the same
    # reason (an optional group in front is four times slower over text).
    return re.compile(rf"(?<![A-Za-z0-9+/])[A-Za-z0-9+/]{{{chars},}}={{0,2}}")


def blob_runs(text: str, limits: Limits) -> Iterator[tuple[int, int, str]]:
    """The base64 and minified runs of `text`: start, end and what they are."""
    for found in _base64(limits.blob_chars).finditer(text):
        run, start = found.group(), found.start()
        head = _DATA_URL.search(text, max(0, start - 100), start)
        if head is not None:
            yield head.start(), found.end(), "base64"
        elif any(c.isdigit() for c in run) and not run.isdigit() and not run.islower():
            yield start, found.end(), "base64"
    start = 0
    for line in text.split("\n"):
        end = start + len(line)
        if len(line) >= 4 * limits.blob_chars and _dense(line) and not is_salient_text(line):
            yield start, end, "minified"
        start = end + 1


def elide_blobs(text: str, limits: Limits) -> tuple[str, int]:
    """`text` with its blobs as `[base64, N chars elided]`; and how many there were."""
    out = []
    at = count = 0
    for start, end, kind in sorted(blob_runs(text, limits)):
        if start < at:
            continue  # base64 inside a minified line already elided
        out += [text[at:start], f"[{kind}, {end - start} chars elided]"]
        at = end
        count += 1
    out.append(text[at:])
    return "".join(out), count


def blob_share(text: str, limits: Limits) -> float:
    return sum(end - start for start, end, _ in blob_runs(text, limits)) / max(1, len(text))


def _dense(line: str) -> bool:
    """Minified: next to no whitespace."""
    return line.count(" ") + line.count("\t") < 0.03 * len(line)


def _capped(entries: list[str], limit: int | None, what: str) -> tuple[list[str], int]:
    """The first `limit` entries and the salient ones, a note for the rest; and how many
    that is."""
    if limit is None or len(entries) <= limit:
        return entries, 0
    kept = [e for i, e in enumerate(entries) if i < limit or is_salient_text(e)]
    left = len(entries) - len(kept)
    return ([*kept, f"  [\u2026 {left} more {what}]"] if left else kept), left
