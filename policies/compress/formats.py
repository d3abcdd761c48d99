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
from itertools import accumulate

from policies.compress.limits import Limits
from policies.compress.lines import Shrunk, compress_lines
from policies.compress.salience import error_lines, is_salient_text

# `path:line:text` (grep -n, ripgrep; `path-line-text` for context lines): a path without
# spaces that has a slash or an extension (a timestamp's `10:00:00` is no match).
_LINE_NUMBER = re.compile(r"\d+[:-]")
_PATH = re.compile(r"/|\.[A-Za-z]")
SEARCH_SAMPLE = 200  # lines looked at to tell a search result
DIFF = re.compile(r"^(?:diff --git |--- \S|\+\+\+ \S)", re.MULTILINE)
HUNK = re.compile(r"^@@ -\d", re.MULTILINE)
HTML = re.compile(r"\s*(?:<!doctype html|<html|<head|<body)", re.IGNORECASE)
# The lookahead, the first letters of the alternatives, turns most tags away at one test.
_HIDDEN = re.compile(
    r"<(?=[!nst])(?:(script|style|noscript|template|svg)\b.*?</\1\s*>|!--.*?-->)", re.I | re.S
)
_BREAK = re.compile(
    r"<(?:br|/p|/div|/li|/tr|/h[1-6]|/title|/section|/article|/header|/footer|/table|/ul|/ol|"
    r"/pre|/blockquote|/dt|/dd)\b[^>]*>",
    re.IGNORECASE,
)
_TAG = re.compile(r"<[^>]*>")
_ENTITIES = {"&lt;": "<", "&gt;": ">", "&quot;": '"', "&#39;": "'", "&nbsp;": "\xa0", "&amp;": "&"}
_DATA_URL = re.compile(r"data:[\w/+.-]+;base64,\Z")
_BASE64 = re.compile(r"[A-Za-z0-9+/]+={0,2}")
_DIFF_KEPT = ("diff ", "--- ", "+++ ", "@@", "new file", "deleted file", "rename ", "Binary ")
SEARCH_MORE = "matches in this file"
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


def _match(line: str) -> tuple[str, str] | None:
    """The path of a search's line and the rest, `line:text` (None when it is none)."""
    path, colon, rest = line.partition(":")
    if not colon or not _is_path(path):
        return None
    return (path, rest) if _LINE_NUMBER.match(rest) else None


def _is_path(path: str) -> bool:
    return len(path) <= 400 and " " not in path and "\t" not in path and bool(_PATH.search(path))


def is_diff(text: str) -> bool:
    # A substring first: a MULTILINE regex over 100 KB is a millisecond.
    hunk = "\n@@ -" in text or text.startswith("@@ -")
    return hunk and HUNK.search(text) is not None and DIFF.search(text) is not None


def is_html(text: str) -> bool:
    return HTML.match(text) is not None


# A group's head (None: the lines that belong to no file or hunk), its lines, kept as they
# are, and the indices among them of the salient ones (kept past any cap).
Group = tuple[str | None, list[str], list[int]]


@functools.lru_cache(maxsize=4)
def search_groups(text: str) -> list[Group]:
    """A search's matches by file, each as `  line:text` (the path said once, before them);
    the lines that are no match, last. Cached: the lossless form and a lossy one are both
    made from them."""
    salient = set(error_lines(text))
    files: dict[str, Group] = {}
    other: Group = (None, [], [])
    paths: dict[str, bool] = {}  # whether each is a path: a search names each file many times
    line_number = _LINE_NUMBER.match
    for index, line in enumerate(text.split("\n")):
        path, colon, rest = line.partition(":")  # `_match`, inlined: a call a line is slow
        group = other
        if colon:
            is_path = paths.get(path)
            if is_path is None:
                is_path = paths[path] = _is_path(path)
            if is_path and line_number(rest):
                found = files.get(path)
                group = files[path] = (path, [], []) if found is None else found
                line = f"  {rest}"
        if group is other and line in ("", "--"):
            continue
        if index in salient:
            group[2].append(len(group[1]))
        group[1].append(line)
    return [*files.values(), other]


def diff_groups(text: str) -> tuple[list[Group], int]:
    """A diff's file and hunk headers, each with the changed lines after it; and how many
    context lines it had."""
    salient = set(error_lines(text))
    groups: list[Group] = [(None, [], [])]
    context = 0
    for index, line in enumerate(text.split("\n")):
        if line.startswith(("+", "-")) and not line.startswith(("+++ ", "--- ")):
            if index in salient:
                groups[-1][2].append(len(groups[-1][1]))
            groups[-1][1].append(line)
        elif line.startswith(_DIFF_KEPT):
            groups.append((line, [], []))
        elif not line.startswith("index "):
            context += 1
    return groups, context


def render(groups: list[Group], cap: int | None, what: str) -> tuple[str, int]:
    """Each group's head and at most `cap` of its lines besides the salient ones; and how many
    lines were left out."""
    out: list[str] = []
    left = 0
    for head, lines, salient in groups:
        if head is not None:
            out.append(head)
        kept, more = _capped(lines, salient, cap, what)
        out += kept
        left += more
    return "\n".join(out), left


def compress_diff(text: str, budget: int, limits: Limits) -> Shrunk:
    groups, context = diff_groups(text)
    for share in _TRIES:
        body, changed = render(groups, round(limits.items * share), "changed lines in this hunk")
        if len(body) <= budget:
            break
    notes = [f"{context} context lines"]
    if changed:
        notes.append(f"{changed} changed lines")
    return Shrunk(body, ", ".join(notes))


def search_size(text: str, cap: int | None) -> int:
    """The length of `render(search_groups(text), cap, SEARCH_MORE)[0]`, counted without
    making it: each try of a lossy form is sized, and only the one that fits is made."""
    lossless, _, sizes = _sizes(text)
    if cap is None:
        return lossless
    size = 0
    for head, ends, lines, salient in sizes:
        size += head
        if len(lines) <= cap:
            size += ends[-1] + len(lines) if lines else 0
            continue
        late = [len(lines[i]) + 1 for i in salient if i >= cap]
        size += (ends[cap - 1] + cap if cap else 0) + sum(late)
        left = len(lines) - cap - len(late)
        if left:
            size += len(_more(left, SEARCH_MORE)) + 1
    return max(0, size - 1)  # no newline after the last line


@functools.lru_cache(maxsize=4)
def _sizes(text: str) -> tuple[int, int, list[tuple[int, list[int], list[str], list[int]]]]:
    """The length of a search's lossless form, and of its heads alone (what any form is at
    least); and of each of its groups: its head's length with its newline, the running length
    of its lines (without theirs), its lines and its salient ones."""
    sizes = [
        (0 if head is None else len(head) + 1, list(accumulate(map(len, lines))), lines, salient)
        for head, lines, salient in search_groups(text)
    ]
    lossless = sum(head + (ends[-1] + len(ends) if ends else 0) for head, ends, _, _ in sizes)
    heads = sum(head for head, _, _, _ in sizes)
    return max(0, lossless - 1), max(0, heads - 1), sizes


def compress_search(text: str, budget: int, limits: Limits) -> Shrunk:
    groups = search_groups(text)
    # Every form names each file: when the names alone are over the budget no try fits, and
    # the last (the fewest matches) is made without sizing the others.
    for share in _TRIES if _sizes(text)[1] <= budget else _TRIES[-1:]:
        cap = round(limits.items * share)
        if search_size(text, cap) <= budget:
            break
    body, left = render(groups, cap, SEARCH_MORE)
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
    text = unescape(_TAG.sub(" ", text))
    # Each line's whitespace collapsed, the blank lines left out, in C (`map`, `filter`).
    return "\n".join(filter(None, map(" ".join, map(str.split, text.split("\n")))))


def unescape(text: str) -> str:
    """`html.unescape(text)`; by `str.replace` when every `&` begins one of the common
    entities (html.unescape calls back into Python for each one)."""
    counts = [text.count(entity) for entity in _ENTITIES]
    if text.count("&") != sum(counts):
        return html.unescape(text)
    # Each entity is one charref of html.unescape (none holds a second `&`), and `&` comes
    # back last, so that no replacement makes another entity; those absent are not looked for.
    for (entity, char), present in zip(_ENTITIES.items(), counts, strict=True):
        if present:
            text = text.replace(entity, char)
    return text


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
    lines = text.split("\n")
    lengths = list(map(len, lines))
    if max(lengths) < chars:  # most outputs: no line, so no token, that long; none looked at
        return
    at = 0
    tokens = text.split()
    # Few outputs have a token that long: their lengths are measured in C, none looked at.
    for token in tokens if tokens and max(map(len, tokens)) >= chars else ():
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
    if max(lengths) < 4 * chars:  # most outputs: no line long enough, none looked at
        return
    start = 0
    for line, length in zip(lines, lengths, strict=True):
        end = start + length
        if length >= 4 * chars and _dense(line) and not is_salient_text(line):
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


def _capped(
    lines: list[str], salient: list[int], cap: int | None, what: str
) -> tuple[list[str], int]:
    """The first `cap` lines and the salient ones, a note for the rest; and how many that
    is."""
    if cap is None or len(lines) <= cap:
        return lines, 0
    kept = lines[:cap] + [lines[i] for i in salient if i >= cap]
    left = len(lines) - len(kept)
    return ([*kept, _more(left, what)] if left else kept), left


def _more(left: int, what: str) -> str:
    return f"  [\u2026 {left} more {what}]"
