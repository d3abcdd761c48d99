"""The tool output compressors (policies.compress): properties over random outputs (never
longer, deterministic, every error line of a log kept, JSON stays JSON with its differing
records) and examples of each kind's form."""

from __future__ import annotations

import base64
import json
import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies.compress import (
    Compressed,
    Limits,
    Marker,
    compress,
    detect,
    finding_lines,
    formats,
    salient_lines,
)
from policies.compress.salience import is_salient_text
from tests.conftest import examples

BUDGETS = st.sampled_from([None, 40, 400, 2000, 8000])
WORDS = ("step", "ok", "done", "loading", "cache", "module", "worker", "request", "sent", "id")
ERRORS = (
    "ERROR database connection refused",
    "FATAL out of memory",
    "tests/test_app.py::test_login FAILED",
    "ValueError: invalid literal for int()",
    "E       assert 3 == 4",
    "--- FAIL: TestParse (0.00s)",
)


@st.composite
def logs(draw: st.DrawFn) -> tuple[str, list[str]]:
    """A build/test log: info lines, repeated lines, a few error lines and tracebacks."""
    lines: list[str] = []
    errors: list[str] = []
    for n in range(draw(st.integers(1, 400))):
        roll = draw(st.integers(0, 99))
        if roll < 4:
            error = draw(st.sampled_from(ERRORS))
            lines.append(error)
            errors.append(error)
        elif roll < 6:
            frames = draw(st.integers(1, 4))
            lines.append("Traceback (most recent call last):")
            lines += [f'  File "mod{i}.py", line {i}, in f{i}' for i in range(frames)]
            lines.append("KeyError: 'user'")
            errors += ["Traceback (most recent call last):", "KeyError: 'user'"]
        elif roll < 15 and lines:
            lines.append(lines[-1])  # a repeated line
        elif roll < 20:
            lines.append("WARNING: deprecated call")
        else:
            words = draw(st.lists(st.sampled_from(WORDS), min_size=1, max_size=12))
            lines.append(f"[{n:05d}] INFO " + " ".join(words))
    return "\n".join(lines), errors


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=30) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=200,
)


@st.composite
def record_arrays(draw: st.DrawFn) -> tuple[list[dict], int]:
    """An array of uniform records, one of which is an error; and that record's index."""
    count = draw(st.integers(3, 300))
    records = [
        {"id": i, "status": "ok", "name": draw(st.sampled_from(WORDS)), "n": i * 7}
        for i in range(count)
    ]
    bad = draw(st.integers(0, count - 1))
    records[bad] = {**records[bad], "status": "error", "detail": "disk quota exceeded"}
    return records, bad


texts = st.one_of(
    st.text(max_size=3000),
    logs().map(lambda log: log[0]),
    json_values.map(lambda value: json.dumps(value, indent=2)),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=texts, budget=BUDGETS)
def test_never_longer_than_the_original_and_deterministic(text: str, budget: int | None) -> None:
    first = compress(text, budget)
    again = compress(text, budget)
    if first is None:
        assert again is None
        return
    assert again is not None and again.text == first.text
    assert len(first.text) < len(text)
    marker = Marker.parse(first.text)
    assert marker is not None and marker.kind == first.kind and marker.chars == len(text)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(log=logs(), budget=BUDGETS)
def test_every_error_line_of_a_log_is_kept(log: tuple[str, list[str]], budget: int | None) -> None:
    text, errors = log
    result = compress(text, budget)
    kept = set((result.text if result is not None else text).split("\n"))
    assert [error for error in errors if error not in kept] == []


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=json_values, indent=st.sampled_from([None, 2]), budget=BUDGETS)
def test_json_stays_valid_json(value: object, indent: int | None, budget: int | None) -> None:
    text = json.dumps(value, indent=indent)
    result = compress(text, budget)
    if result is not None:
        data = json.loads(result.text)
        assert Marker.parse(data["compressed"]) == result.marker
        if budget is None and "form" not in data:
            assert data["data"] == value  # lossless


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(array=record_arrays(), budget=st.sampled_from([40, 400, 2000]))
def test_the_record_that_differs_is_kept_verbatim(array: tuple[list[dict], int], budget: int):
    records, bad = array
    text = json.dumps({"results": records, "total": len(records)}, indent=2)
    result = compress(text, budget)
    assert result is not None
    data = json.loads(result.text)
    assert records[bad] in data["data"]["results"]
    assert salient_lines(text) == [json.dumps(records[bad], separators=(",", ":"))]


# --- examples of each kind ---------------------------------------------------------------


def body(result: Compressed | None) -> list[str]:
    """The lines of a compressed text after its marker."""
    assert result is not None
    return result.text.split("\n")[1:]


search_lines = st.lists(
    st.one_of(
        st.builds(
            "{}:{}:{}".format,
            st.sampled_from(["src/a.py", "lib/b.c", "c.md", "a b.py", "x"]),
            st.integers(0, 999),
            st.sampled_from(["x = 1", "ERROR failed", "", "value " * 20]),
        ),
        st.sampled_from(["--", "", "FATAL crash", "note"]),
    ),
    min_size=3,
    max_size=200,
)


@settings(max_examples=examples(200), deadline=None)
@given(lines=search_lines, cap=st.sampled_from([None, 0, 1, 2, 5, 20]))
def test_a_search_form_is_sized_as_it_is_made(lines: list[str], cap: int | None) -> None:
    text = "\n".join(lines)
    body, _ = formats.render(formats.search_groups(text), cap, formats.SEARCH_MORE)
    assert formats.search_size(text, cap) == len(body)


def test_records_become_a_lossless_table() -> None:
    records = [{"id": i, "status": "ok", "region": "eu-west-1"} for i in range(100)]
    text = json.dumps(records, indent=2)
    result = compress(text, None)
    assert result is not None and result.kind == "json"
    data = json.loads(result.text)
    assert data["form"] == "arrays of records as columns and rows"
    table = data["data"]
    assert table["columns"] == ["id", "status", "region"]
    assert [dict(zip(table["columns"], row, strict=True)) for row in table["rows"]] == records
    assert len(result.text) < 0.6 * len(json.dumps(records, separators=(",", ":")))


def test_a_long_array_keeps_its_ends_and_counts_what_it_elided() -> None:
    records = [{"id": i, "status": "ok" if i % 50 else "pending"} for i in range(500)]
    records[250]["status"] = "error"
    result = compress(json.dumps(records), 1000)
    assert result is not None
    kept = json.loads(result.text)["data"]
    assert kept[0] == records[0] and kept[-1] == records[-1] and records[250] in kept
    notes = [item for item in kept if isinstance(item, str)]
    assert notes and all("records elided (status: ok" in note for note in notes)
    assert result.marker.elided.endswith("of 500 records")


def test_an_elision_that_would_save_nothing_is_not_made() -> None:
    profile = {
        "user_id": "mia_li_3668",
        "reservations": ["NO6JO3", "AIXC49"],  # shorter than a note that they went
        "seats": [12, 14, 15, 16, 17],
        "notes": "a long remark " * 100,
        "history": [f"event {i}: the passenger called about the booking" for i in range(40)],
    }
    result = compress(json.dumps(profile), 240)
    assert result is not None
    data = json.loads(result.text)["data"]
    assert data["reservations"] == profile["reservations"] and data["seats"] == profile["seats"]
    assert data["user_id"] == profile["user_id"]
    assert any("items elided" in item for item in data["history"] if isinstance(item, str))


def test_a_json_string_stays_a_json_string() -> None:
    text = json.dumps("the whole answer in one string " * 200)
    result = compress(text, 400)
    assert result is not None and result.kind == "json"
    data = json.loads(result.text)
    assert isinstance(data["data"], str) and len(result.text) < 600


def test_a_log_keeps_its_errors_with_context_and_its_ends() -> None:
    lines = [f"[{i:04d}] INFO compiling module {i}" for i in range(3000)]
    lines[1500] = "[1500] ERROR linker failed: undefined symbol foo"
    lines[2000:2000] = [
        "Traceback (most recent call last):",
        '  File "x.py", line 1',
        "OSError: disk",
    ]
    text = "\n".join(lines)
    result = compress(text, 2000)
    assert result is not None and result.kind == "log"
    out = result.text.split("\n")
    assert out[0] == f"[compressed tool output: log, {len(text)} chars; elided: 2945 of 3003 lines]"
    for kept in (lines[0], lines[1499], lines[1500], lines[1501], lines[-1], "OSError: disk"):
        assert kept in out
    assert any(line.startswith("[\u2026 ") and "lines elided" in line for line in out)
    assert len(result.text) < 2600


def test_repeated_lines_collapse_with_their_count_losslessly() -> None:
    text = "start\n" + "waiting for the lock held by pid 4242\n" * 200 + "done"
    result = compress(text, None)
    assert result is not None
    assert body(result) == [
        "start",
        "waiting for the lock held by pid 4242",
        "[previous line repeated 199 more times]",
        "done",
    ]
    assert result.marker.elided == ""


def test_search_results_are_grouped_by_file() -> None:
    text = "\n".join(
        [f"src/app.py:{n}:    handle(request)" for n in range(10, 40)]
        + [f"src/db/models.py:{n}:class Model{n}:" for n in range(5)]
    )
    assert detect(text) == "search"
    result = compress(text, None)
    assert result is not None
    lines = body(result)
    assert lines[0] == "src/app.py" and lines[1] == "  10:    handle(request)"
    assert lines[31] == "src/db/models.py" and lines[32] == "  0:class Model0:"
    shorter = compress(text, 300)
    assert shorter is not None and "more matches in this file]" in shorter.text


def test_a_diff_keeps_its_headers_and_changed_lines() -> None:
    head = "diff --git a/app.py b/app.py\nindex 1111..2222 100644\n--- a/app.py\n+++ b/app.py"
    context = [f" context line {i}" for i in range(80)]
    lines = [head, "@@ -1,9 +1,9 @@", *context[:40], "-old = 1", "+new = 2", *context[40:]]
    result = compress("\n".join(lines) + "\n", 400)
    assert result is not None and result.kind == "diff"
    kept = "diff --git a/app.py b/app.py\n--- a/app.py\n+++ b/app.py\n@@ -1,9 +1,9 @@\n"
    assert body(result) == f"{kept}-old = 1\n+new = 2".split("\n")
    assert result.marker.elided == "81 context lines"


def test_html_becomes_its_text() -> None:
    page = (
        "<!DOCTYPE html><html><head><title>Build 42</title><style>body{color:red}</style>"
        "<script>var x = 1;</script></head><body>"
        + "".join(f"<div class='row'><p>Result {i} &amp; status</p></div>" for i in range(200))
        + "</body></html>"
    )
    result = compress(page, 20000)
    assert result is not None and result.kind == "html"
    lines = body(result)
    assert lines[:2] == ["Build 42", "Result 0 & status"] and "var x" not in result.text


def test_blobs_are_elided_with_their_size() -> None:
    blob = base64.b64encode(random.Random(7).randbytes(3000)).decode()
    text = f"uploading icon.png\ndata:image/png;base64,{blob}\nupload finished"
    result = compress(text, 1000)
    assert result is not None and result.kind == "blob"
    assert body(result) == [
        "uploading icon.png",
        f"[base64, {len(blob) + 22} chars elided]",
        "upload finished",
    ]


def test_other_text_keeps_its_head_and_its_tail() -> None:
    text = " ".join(f"word{i}" for i in range(5000))
    result = compress(text, 1000)
    assert result is not None and result.kind == "text"
    assert "word0 word1" in result.text and "word4998 word4999" in result.text
    assert "chars elided]" in result.text


def test_a_compressed_output_is_not_compressed_again() -> None:
    text = "\n".join(f"line {i} of the output" for i in range(1000))
    result = compress(text, 1000)
    assert result is not None and compress(result.text, 100) is None


def test_the_marker_can_carry_a_handle() -> None:
    marker = Marker("log", 102400, "3058 of 3120 lines", handle="h-7f3a")
    text = marker.render()
    assert text == (
        "[compressed tool output: log, 102400 chars; elided: 3058 of 3120 lines; handle=h-7f3a]"
    )
    assert Marker.parse(f"before {text}\nafter") == marker
    assert Marker.parse(Marker("json", 10).render()) == Marker("json", 10)


def test_salient_lines_are_errors_or_the_whole_error() -> None:
    log = "step 1 ok\nERROR: disk full\nstep 2 ok\n" + "x = 1\n" * 5
    assert salient_lines(log) == ["ERROR: disk full"]
    assert salient_lines("all good\nnothing to see") == []
    assert salient_lines("permission problem\nfor /etc/x\n", is_error=True) == [
        "permission problem",
        "for /etc/x",
    ]
    many = "\n".join(f"ERROR {i}" for i in range(20))
    assert salient_lines(many) == [f"ERROR {i}" for i in (0, 1, 2, 15, 16, 17, 18, 19)]


def test_limits_are_checked_and_change_the_form() -> None:
    text = "\n".join(
        [*(f"info {i}" for i in range(300)), "ERROR boom", *(f"after {i}" for i in range(300))]
    )
    narrow = compress(text, 200, limits=Limits(context_lines=0))
    wide = compress(text, 200, limits=Limits(context_lines=3))
    assert narrow is not None and wide is not None
    assert "after 2" not in narrow.text.split("\n") and "after 2" in wide.text.split("\n")
    assert compress(text, 200, kinds=("json",)) is None
    assert is_salient_text("NullPointerException at Foo") and not is_salient_text("all fine")


def _templated_log(finding: str) -> str:
    lines = [f"[build 07.{n:03d}] compiling module cache/ABCDE in {n * 7} ms" for n in range(200)]
    lines.insert(100, finding)
    return "\n".join(lines)


def test_a_templated_output_keeps_what_stands_out_of_it() -> None:
    log = _templated_log("FACT-07: the build cache key is 9f3a1c2e.")
    compressed = compress(log, 1000)
    assert compressed is not None and "FACT-07: the build cache key is 9f3a1c2e." in compressed.text
    assert salient_lines(log) == ["FACT-07: the build cache key is 9f3a1c2e."]
    source = "def area(r):\n    pi = 3.14\n    return pi * r * r\n\nprint(area(2))"
    assert finding_lines(source) == []  # no template: nothing stands out
