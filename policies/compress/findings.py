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


def finding_indices(lines: list[str]) -> list[int]:
    """The indices of the `lines` that stand out of their template, in order; none when they
    have no template or too many stand out."""
    # Digits collapsed in one pass over all lines (no digit run crosses a newline, and
    # stripping commutes with it): a regex call a line is most of the cost of a 100 KB output.
    collapsed = _DIGITS.sub("0", "\n".join(lines)).split("\n")
    forms = [line[:FORM_CHARS] for line in map(str.strip, collapsed)]
    counts = Counter(forms)  # counted in C; blank lines ("") have no form
    counts.pop("", None)
    if not counts or max(counts.values()) < MIN_REPEATS:
        return []
    once = {form for form, count in counts.items() if count == 1}
    found = [i for i, form in enumerate(forms) if form in once]
    # The first line is the output's header (a title, the command echoed), not a finding.
    found = found[1:] if found and found[0] == 0 else found
    return found if len(found) <= MAX_FINDINGS else []


def finding_lines(text: str) -> list[str]:
    """The lines of `text` that stand out of its template (`finding_indices`), stripped, each
    at most FINDING_CHARS characters."""
    lines = text.split("\n")
    return [lines[i].strip()[:FINDING_CHARS] for i in finding_indices(lines)]
