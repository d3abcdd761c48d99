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

# `path:line:text` (grep -n, ripgrep); the path, possessive and bounded, is never tried again
# from another start (a quadratic search over a long line), and must have a slash or an
# extension (a timestamp's `10:00:00` is no match).
SEARCH_LINE = re.compile(r"(?P<path>[^\s:]{1,400}+):(?P<line>\d+)(?P<sep>[:-])(?P<text>.*)")
_PATH = re.compile(r"/|\.[A-Za-z]")
SEARCH_SAMPLE = 200  # lines looked at to tell a search result
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
_BASE64 = re.compile(r"[A-Za-z0-9+/]+={0,2}")
_DIFF_KEPT = ("diff ", "--- ", "+++ ", "@@", "new file", "deleted file", "rename ", "Binary ")
# Per-file matches (search) and per-hunk changed lines (diff) at each try, as shares of
# `Limits.items`, until the form fits.
_TRIES = (1.0, 0.5, 0.25, 0.1, 0.0)


def is_search(lines: list[str]) -> bool:
    """Whether nearly every line (of the first ones) is a `path:line:text` match (or grep's
    `--` separator)."""
    content = [line for line in lines[: 2 * SEARCH_SAMPLE] if line and line != "--"]
    content = content[:SEARCH_SAMPLE]
    if len(content) < 3:
        return False
    matching = sum(_match(line) is not None for line in content)
    return matching >= 0.8 * len(content)


def _match(line: str) -> re.Match[str] | None:
    found = SEARCH_LINE.fullmatch(line)
    return found if found is not None and _PATH.search(found["path"]) else None


def is_diff(text: str) -> bool:
    # A substring first: a MULTILINE regex over 100 KB is a millisecond.
    hunk = "\n@@ -" in text or text.startswith("@@ -")
    return hunk and HUNK.search(text) is not None and DIFF.search(text) is not None


def is_html(text: str) -> bool:
    return HTML.match(text) is not None


def grouped(lines: list[str], per_file: int | None) -> tuple[str, int]:
    """A search's matches grouped by file: the path, then its matches as `  line:text`; with
    `per_file`, at most that many of a file's matches besides the salient ones. And how many
    matches were left out."""
    files: dict[str, list[str]] = {}
    other: list[str] = []
    for line in lines:
        found = _match(line)
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


def blob_runs(text: str, limits: Limits) -> tuple[tuple[int, int, str], ...]:
    """The base64 and minified runs of `text`: start, end and what they are. Cached, as
    `error_lines`: telling the kind and compressing both need them."""
    return _blob_runs(text, limits.blob_chars)


@functools.lru_cache(maxsize=8)
def _blob_runs(text: str, chars: int) -> tuple[tuple[int, int, str], ...]:
    return tuple(_runs(text, chars))


def _runs(text: str, chars: int) -> Iterator[tuple[int, int, str]]:
    """Looked for only in the long whitespace-free tokens (split in C): a regex over the
    whole text tries again at every position of every word, ten times slower."""
    at = 0
    for token in text.split():
        if len(token) < chars:
            continue
        at = text.find(token, at)
        for found in _BASE64.finditer(token):
            if found.end() - found.start() < chars:
                continue
            start, end = at + found.start(), at + found.end()
            head = _DATA_URL.search(text, max(0, start - 100), start)
            if head is not None:
                yield head.start(), end, "base64"
            elif _mixed(found.group()):
                yield start, end, "base64"
        at += len(token)
    start = 0
    for line in text.split("\n"):
        end = start + len(line)
        if len(line) >= 4 * chars and _dense(line) and not is_salient_text(line):
            yield start, end, "minified"
        start = end + 1


def _mixed(run: str) -> bool:
    """Base64 rather than a long word: digits and letters of both cases."""
    return any(c.isdigit() for c in run) and not run.isdigit() and not run.islower()


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
