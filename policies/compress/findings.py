"""The findings of a tool output: the lines that stand out of a templated output (a log, a
listing, a report whose lines share a form), such as `FACT-07: the build cache key is
9f3a1c2e.` in the middle of a build log, or `coverage: 81%` after a list of test results.

A line's form is its beginning with digits collapsed (`[build 07.012] compiling` and
`[build 08.003] compiling` have one form); an output where some form repeats is templated,
and its lines of a form seen once are its findings. An output with no repeated form (source
code, prose) has none: every line would stand out, so none tells. Its first line is its
header (a title, the command echoed), not a finding.
"""

from __future__ import annotations

import re
from collections import Counter

FORM_CHARS = 24  # the beginning of a line that makes its form
MIN_REPEATS = 3  # a form seen this often makes an output templated
MAX_FINDINGS = 3  # more are not what stands out but a second template
FINDING_CHARS = 240
_DIGITS = re.compile(r"\d+")
_TO_ZERO = bytes.maketrans(b"123456789", b"000000000")
_ASCII = bytes(range(128))


def finding_indices(lines: list[str]) -> list[int]:
    """The indices of the `lines` that stand out of their template, in order; none when they
    have no template or too many stand out."""
    # Digits collapsed in one pass over all lines (no digit run crosses a newline, and
    # stripping commutes with it): a regex call a line is most of the cost of a 100 KB output.
    collapsed = collapse_digits("\n".join(lines)).split("\n")
    forms = [line[:FORM_CHARS] for line in map(str.strip, collapsed)]
    counts = Counter(forms)  # counted in C; blank lines ("") have no form
    counts.pop("", None)
    if not counts or max(counts.values()) < MIN_REPEATS:
        return []
    once = [form for form, count in counts.items() if count == 1]
    if len(once) > MAX_FINDINGS + 1:  # too many even if one is the header: none looked up
        return []
    found = sorted(map(forms.index, once))  # each seen once: its one line
    # The first line is the output's header (a title, the command echoed), not a finding.
    found = found[1:] if found and found[0] == 0 else found
    return found if len(found) <= MAX_FINDINGS else []


def collapse_digits(text: str) -> str:
    """`text` with each run of digits as one `0`: `re.sub(r"\\d+", "0", text)`, in C (the
    regex makes a match object a run: most of a 100 KB log's findings)."""
    data = text.encode(errors="surrogatepass")  # a lone surrogate (JSON allows one) too
    # In UTF-8 an ASCII digit is its one byte, found in no other character's; a digit of
    # another script (`\\d` is any Unicode digit) is left to the regex.
    if not text.isascii():
        others = data.translate(None, _ASCII).decode(errors="surrogatepass")
        if _DIGITS.search(others):
            return _DIGITS.sub("0", text)
    # Every digit a `0`, then each run of `0`s one: the pieces between runs, joined by one.
    pieces = data.translate(_TO_ZERO).split(b"0")
    inner = b"0".join(filter(None, pieces))
    if not inner:
        return "0" if len(pieces) > 1 else ""
    first = b"0" if not pieces[0] else b""
    last = b"0" if not pieces[-1] else b""
    return (first + inner + last).decode(errors="surrogatepass")


def finding_lines(text: str) -> list[str]:
    """The lines of `text` that stand out of its template (`finding_indices`), stripped, each
    at most FINDING_CHARS characters."""
    lines = text.split("\n")
    return [lines[i].strip()[:FINDING_CHARS] for i in finding_indices(lines)]
