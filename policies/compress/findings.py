"""The findings of a tool output: the lines that stand out of a templated output (a log, a
listing, a report whose lines share a form), such as `FACT-07: the build cache key is
9f3a1c2e.` in the middle of a build log, or `coverage: 81%` after a list of test results.

A line's form is its beginning with digits collapsed (`[build 07.012] compiling` and
`[build 08.003] compiling` have one form); an output where some form repeats is templated,
and its lines of a form seen once are its findings. An output with no repeated form (source
code, prose) has none: every line would stand out, so none tells.
"""

from __future__ import annotations

import re
from collections import Counter

FORM_CHARS = 24  # the beginning of a line that makes its form
MIN_REPEATS = 3  # a form seen this often makes an output templated
MAX_FINDINGS = 3  # more are not what stands out but a second template
FINDING_CHARS = 240
_DIGITS = re.compile(r"\d+")


def _form(line: str) -> str:
    return _DIGITS.sub("0", line)[:FORM_CHARS]


def finding_lines(text: str) -> list[str]:
    """The lines of `text` that stand out of its template, in order, each at most
    FINDING_CHARS characters; none when it has no template or too much stands out."""
    lines = [line.strip() for line in text.split("\n")]
    lines = [line for line in lines if line]
    forms = Counter(map(_form, lines))
    if not forms or max(forms.values()) < MIN_REPEATS:
        return []
    found = [line[:FINDING_CHARS] for line in lines if forms[_form(line)] == 1]
    return found if len(found) <= MAX_FINDINGS else []
