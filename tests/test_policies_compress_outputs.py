"""The compressors' exact bytes, pinned: seeded random outputs of every kind, compressed at
every level and with tight limits, must give the digests recorded in
tests/data/compress_outputs.json (made by the code before issue 25's speed work). A faster
compressor must not change a byte: plans replay compressions and provider caches key on them.

    .venv/bin/python -m tests.test_policies_compress_outputs   # records the digests again
"""

from __future__ import annotations

import base64
import bisect
import hashlib
import html
import json
import random
import re
from collections import Counter
from collections.abc import Callable, Iterator
from itertools import accumulate
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.compress import Limits, compress, formats, salience, salient_lines
from policies.compress.findings import (
    FORM_CHARS,
    MAX_FINDINGS,
    MIN_REPEATS,
    collapse_digits,
    finding_indices,
)
from policies.compress.lines import Shrunk, compress_lines
from tests.conftest import examples

FIXTURE = Path(__file__).parent / "data" / "compress_outputs.json"
SEEDS = range(12)
BUDGETS = (None, 60, 240, 1000, 4000)
LIMITS = (Limits(), Limits(context_lines=0, warning_lines=1, items=3, blob_chars=64))
ERRORS = (
    "ERROR database connection refused",
    "FATAL out of memory",
    "tests/test_app.py::test_login FAILED",
    "ValueError: invalid literal for int()",
    "E       assert 3 == 4",
    "--- FAIL: TestParse (0.00s)",
    "Traceback (most recent call last)",
    "WARNING disk almost full",
)


def _sprinkle(rng: random.Random, lines: list[str]) -> list[str]:
    """`lines` with a few errors, warnings, repeats, blobs and blank lines in random places."""
    for _ in range(rng.randrange(6)):
        at = rng.randrange(len(lines) + 1)
        pick = rng.randrange(6)
        if pick == 0:
            lines[at:at] = [rng.choice(ERRORS)]
        elif pick == 1:
            lines[at:at] = [ERRORS[6], '  File "a.py", line 3', "    x()", "KeyError: 'k'"]
        elif pick == 2 and lines:
            lines[at:at] = [lines[min(at, len(lines) - 1)]] * rng.randrange(2, 30)
        elif pick == 3:
            lines[at:at] = [base64.b64encode(rng.randbytes(rng.randrange(50, 900))).decode()]
        elif pick == 4:
            lines[at:at] = ["", "--"]
        else:
            lines[at:at] = [f"FACT-{rng.randrange(99)}: the cache key is {rng.randrange(10**6)}"]
    return lines


def _lines(rng: random.Random, line: Callable[[int], str]) -> str:
    count = rng.choice((3, 40, 400, 2500))
    return "\n".join(_sprinkle(rng, [line(i) for i in range(count)]))


def _json(rng: random.Random) -> str:
    records: list[dict[str, object]] = [
        {
            "id": i,
            "status": rng.choice(("ok",) * 12 + ("error", "failed", "pending")),
            "sku": f"SKU-{rng.randrange(10**5)}",
            "note": rng.choice(("", "fine", "x" * rng.randrange(3000), "timed out\nretry")),
            "tags": [rng.randrange(9) for _ in range(rng.randrange(4))],
        }
        for i in range(rng.choice((2, 5, 60, 900)))
    ]
    if rng.random() < 0.3:
        records[rng.randrange(len(records))]["error"] = {"message": "connection refused"}
    value: object = records
    if rng.random() < 0.5:
        value = {"items": records, "count": len(records), "log": _lines(rng, str)}
    return json.dumps(value, indent=rng.choice((None, 2)))


def inputs(seed: int) -> Iterator[tuple[str, str]]:
    """Each kind's random output for `seed`, with its name."""
    rng = random.Random(seed)
    n = rng.randrange(1, 50)
    yield "json", _json(rng)
    yield "log", _lines(rng, lambda i: f"[{i:05d}] INFO worker {i % 7} handled {i} in {i % n} ms")
    yield (
        "search",
        _lines(rng, lambda i: f"src/pkg{i % n}/module_{i % 13}.py:{i}:    value = compute({i})"),
    )
    yield (
        "diff",
        "diff --git a/a.py b/a.py\n--- a/a.py\n+++ b/a.py\n@@ -1,9 +1,9 @@\n"
        + _lines(rng, lambda i: f"{' +-'[i % 3]}line {i} of the module body"),
    )
    page = _lines(rng, lambda i: f"<div class='row'><p>Item {i} &amp; its <b>st</b></p></div>")
    yield "html", f"<!DOCTYPE html><html><script>var a = 1;</script><body>{page}"
    yield "blob", f"payload\n{base64.b64encode(rng.randbytes(rng.randrange(200, 40_000))).decode()}"
    yield "text", _lines(rng, lambda i: f"sentence {i} of a long document, {'word ' * (i % n)}")


def digests(seed: int) -> Iterator[tuple[str, str]]:
    """The name of each case of `seed` and the digest of what it gives."""
    for name, text in inputs(seed):
        for index, limits in enumerate(LIMITS):
            for budget in BUDGETS:
                result = compress(text, budget, limits=limits)
                shown = "None" if result is None else f"{result.kind}\n{result.text}"
                case = f"{name} seed {seed} limits {index} budget {budget}"
                yield case, hashlib.sha256(shown.encode()).hexdigest()
            salient = "\n".join(salient_lines(text, limits=limits))
            yield (
                f"{name} seed {seed} limits {index} salient",
                hashlib.sha256(salient.encode()).hexdigest(),
            )


@pytest.mark.parametrize("seed", SEEDS)
def test_compressed_bytes_are_those_recorded(seed: int) -> None:
    recorded = json.loads(FIXTURE.read_text())
    prefix = f" seed {seed} "
    assert dict(digests(seed)) == {case: d for case, d in recorded.items() if prefix in case}


if __name__ == "__main__":
    every = {case: digest for seed in SEEDS for case, digest in digests(seed)}
    FIXTURE.write_text(json.dumps(every, indent=1, sort_keys=True) + "\n")


PIECES = ("&", "&amp;", "&lt;", "&#39;", "&nbsp;", "&ampx", "amp;", "lt", ";", "#", "a")


@given(st.lists(st.sampled_from(PIECES)).map("".join))
@settings(max_examples=examples(500))
def test_unescape_is_that_of_the_standard_library(text: str) -> None:
    assert formats.unescape(text) == html.unescape(text)


@given(st.lists(st.text(alphabet=st.sampled_from("a1 \t\u0660\u2028x"), max_size=30)))
@settings(max_examples=examples(500))
def test_finding_forms_are_those_collapsed_a_line(lines: list[str]) -> None:
    forms = [re.sub(r"\d+", "0", line.strip())[:FORM_CHARS] or None for line in lines]
    counts = Counter(form for form in forms if form is not None)
    found = [i for i, form in enumerate(forms) if i and form is not None and counts[form] == 1]
    templated = counts and max(counts.values()) >= MIN_REPEATS and len(found) <= MAX_FINDINGS
    assert finding_indices(lines) == (found if templated else [])


@given(st.text(alphabet=st.sampled_from("0129a \n\xa0\u2026\u0660\U0001d7ce\udc80")))
@settings(max_examples=examples(500))
def test_digits_collapse_as_the_regex_does(text: str) -> None:
    assert collapse_digits(text) == re.sub(r"\d+", "0", text)


ERROR_PIECES = ("error", "ERROR", "Fatal", "\nE   x", "E   y", "--- FAIL", "\u2715 ", "warn", "\n")


@given(st.lists(st.sampled_from((*ERROR_PIECES, "a", " ", "\u0130", "\u212a"))).map("".join))
@settings(max_examples=examples(500))
def test_error_lines_are_the_lines_of_the_error_offsets(text: str) -> None:
    """The line of each error word or failure mark, as the lines' offsets and bisect told it."""
    starts = list(accumulate((len(line) + 1 for line in text.split("\n")), initial=0))
    offsets = [*salience.error_offsets(text), *(0 for _ in [1] if text.startswith("E  "))]
    for mark in salience.LINE_STARTS:
        offsets += [m.start() + (mark[0] == "\n") for m in re.finditer(re.escape(mark), text)]
    lines = sorted({bisect.bisect_right(starts, offset) - 1 for offset in offsets})
    assert salience.error_lines(text) == tuple(lines)
    assert salience.has_warning(text) == ("warn" in text.lower())


TAG_PIECES = (
    "<",
    ">",
    "</",
    "!--",
    "-->",
    "script",
    "SCR\u0130PT",
    "\u017ftyle",
    "svg",
    "br",
    "/p",
    "p",
)


def _old_html_text(text: str) -> str:
    hidden = r"<(script|style|noscript|template|svg)\b.*?</\1\s*>|<!--.*?-->"
    text = re.sub(hidden, " ", text, flags=re.I | re.S)
    text = formats.unescape(formats._TAG.sub(" ", formats._BREAK.sub("\n", text)))
    lines = (" ".join(line.split()) for line in text.split("\n"))
    return "\n".join(line for line in lines if line)


@given(st.lists(st.sampled_from((*TAG_PIECES, " ", "\n", "\t", "x", "&amp;"))).map("".join))
@settings(max_examples=examples(500))
def test_html_text_is_that_of_the_plain_regexes_and_a_loop(text: str) -> None:
    assert formats.html_text(text) == _old_html_text(text)


@settings(max_examples=examples(200), deadline=None)
@given(
    files=st.integers(1, 60),
    matches=st.integers(1, 40),
    budget=st.sampled_from([60, 240, 1000, 4000]),
)
def test_a_search_takes_the_first_form_that_fits(files: int, matches: int, budget: int) -> None:
    """Trying only the last form when the file names alone are over the budget changes
    nothing: every form is tried and the first that fits made."""
    lines = [f"src/pkg{i % files}/a_module.py:{i}:    x = f({i})" for i in range(files * matches)]
    text = "\n".join(lines)
    limits = Limits()
    for share in formats._TRIES:
        cap = round(limits.items * share)
        body, left = formats.render(formats.search_groups(text), cap, formats.SEARCH_MORE)
        if len(body) <= budget:
            break
    elided = f"{left} matches" if left else ""
    if len(body) > budget:
        shrunk = compress_lines(body, budget, limits)
        body, elided = shrunk.body, ", ".join(note for note in (elided, shrunk.elided) if note)
    assert formats.compress_search(text, budget, limits) == Shrunk(body, elided)
