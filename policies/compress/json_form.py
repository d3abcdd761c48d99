"""JSON outputs, compressed as JSON: compact, with arrays of records as tables when that is
smaller (lossless); when that is not enough, long arrays keep their ends and the records that
differ from the rest (error or non-ok statuses), with counts of what was elided, and long
strings are compressed as text. A valid JSON output stays valid JSON.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Callable
from itertools import accumulate
from typing import Any

import orjson

from policies.compress.limits import Limits
from policies.compress.lines import Shrunk, compress_lines, middle_out
from policies.compress.salience import error_offsets, is_salient_text

STATUS_KEYS = frozenset(
    {
        "status",
        "state",
        "result",
        "outcome",
        "level",
        "severity",
        "ok",
        "success",
        "passed",
        "conclusion",
        "health",
        "code",
        "status_code",
    }
)
ERROR_KEYS = frozenset({"error", "errors", "exception", "failure", "failures", "stderr"})
MINORITY = 0.25  # a status value this rare among the records makes its records differ
# (items kept of a long array, characters kept of a long string) at each try, until it fits.
_TRIES = ((1.0, 2000), (0.5, 600), (0.25, 240), (0.1, 120), (0.0, 60))


def parse(text: str) -> Any:
    """The JSON value of `text`; ValueError when it is not an array, object or string in JSON
    (a JSON string is compressed as one, so that it stays JSON)."""
    stripped = text.lstrip()
    if not stripped.startswith(("{", "[", '"')):
        raise ValueError("not a JSON array, object or string")
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as error:
        raise ValueError(str(error)) from None


def dumps(value: Any) -> str:
    return orjson.dumps(value).decode()


def tables(value: Any) -> Any:
    """`value` with every array of two or more records of the same keys as
    `{"columns": [...], "rows": [[...], ...]}`: the keys said once, not per record."""
    if type(value) is list:
        if len(value) >= 2 and all(type(item) is dict and item for item in value):
            columns = list(value[0])
            keys = set(columns)
            if all(len(item) == len(keys) and keys.issuperset(item) for item in value):
                return {
                    "columns": columns,
                    "rows": [[_tables(row[c]) for c in columns] for row in value],
                }
        return [_tables(item) for item in value]
    if type(value) is dict:
        return {key: _tables(item) for key, item in value.items()}
    return value


def _tables(value: Any) -> Any:
    # Scalars, most of the values, without a call.
    return tables(value) if type(value) is list or type(value) is dict else value


def shrink(value: Any, budget: int, limits: Limits) -> Shrunk:
    """`value` in about `budget` characters of compact JSON, by the first try that fits."""
    found: dict[int, tuple[set[int], list[Any]]] = {}
    for share, chars in _TRIES:
        tally = _Tally(found)
        shrunk = _shrink(value, max(0, round(limits.items * share)), chars, limits, tally)
        body = dumps(shrunk)
        if len(body) <= budget:
            break
    return Shrunk(body, tally.describe())


def salient_records(value: Any) -> list[str]:
    """The compact JSON of the records that differ from the rest, in every array of records of
    `value`, in order: what a compressed form keeps verbatim."""
    found: list[str] = []
    _walk_records(value, lambda records, index: found.append(dumps(records[index])))
    return found


class _Tally:
    """What one try elided; and of each array, found once for all tries, its salient items and
    (of records) each one's status value, which an elision counts."""

    def __init__(self, found: dict[int, tuple[set[int], list[Any]]]) -> None:
        self.records = self.of = self.items = self.strings = 0
        self.found = found

    def salient(self, value: list[Any], records: bool) -> set[int]:
        return self._of(value, records)[0]

    def statuses(self, value: list[Any]) -> list[Any]:
        return self._of(value, True)[1]

    def _of(self, value: list[Any], records: bool) -> tuple[set[int], list[Any]]:
        key = id(value)  # the arrays of the value being shrunk, alive for all tries
        if key not in self.found:
            status = _status_keys(value) if records else []
            statuses = [_hashable(item.get(status[0])) for item in value] if status else []
            salient = _differing(value) if records else _salient_items(value)
            self.found[key] = (salient, statuses)
        return self.found[key]

    def describe(self) -> str:
        notes = []
        if self.of:
            notes.append(f"{self.records} of {self.of} records")
        if self.items:
            notes.append(f"{self.items} array items")
        if self.strings:
            notes.append(f"the middle of {self.strings} long strings")
        return ", ".join(notes)


def _shrink(value: Any, items: int, chars: int, limits: Limits, tally: _Tally) -> Any:
    if isinstance(value, dict):
        return {key: _shrink(item, items, chars, limits, tally) for key, item in value.items()}
    if isinstance(value, str):
        if len(value) <= chars or (is_salient_text(value) and "\n" not in value):
            return value
        tally.strings += 1
        if "\n" in value:
            return compress_lines(value, chars, limits).body
        return middle_out(value, chars)
    if not isinstance(value, list):
        return value
    records = _is_records(value)
    differing = tally.salient(value, records)
    head = min((items + 1) // 2, len(value))
    tail = range(max(head, len(value) - (items - head)), len(value))
    out: list[Any] = []
    after = 0  # the index after the last kept item
    for index in sorted({*range(head), *tail, *differing}):  # the gaps between: runs elided
        out += _elided(value, range(after, index), records, tally)
        item = value[index]
        out.append(item if index in differing else _shrink(item, items, chars, limits, tally))
        after = index + 1
    out += _elided(value, range(after, len(value)), records, tally)
    if records:
        tally.of += len(value)
    return out


def _elided(value: list[Any], gap: range, records: bool, tally: _Tally) -> list[Any]:
    """The items at `gap` as the note that counts them; as they are when the note would be no
    shorter (a few short ids cost less than a note that they were elided)."""
    if not gap:
        return []
    note = _elision(value, gap, records, tally)
    # Each item takes two characters at least: only a short run can be shorter than its note.
    if 2 * len(gap) <= len(note) + 2:
        items = value[gap.start : gap.stop]
        if len(dumps(items)) <= len(dumps(note)) + 1:
            return items
    if records:
        tally.records += len(gap)
    else:
        tally.items += len(gap)
    return [note]


def _elision(value: list[Any], gap: range, records: bool, tally: _Tally) -> str:
    if not records:
        return f"\u2026 {len(gap)} items elided \u2026"
    counts = ""
    statuses = tally.statuses(value)
    if statuses:
        key = _status_keys(value)[0]
        seen = Counter(statuses[gap.start : gap.stop])
        counts = f" ({key}: " + ", ".join(f"{v} {n}" for v, n in seen.most_common()) + ")"
    return f"\u2026 {len(gap)} records elided{counts} \u2026"


def _status_keys(records: list[Any]) -> list[str]:
    first = records[0]
    return [key for key in first if key.lower() in STATUS_KEYS]


def _hashable(value: Any) -> Any:
    return value if value is None or isinstance(value, str | int | float | bool) else dumps(value)


def _is_records(value: list[Any]) -> bool:
    return len(value) >= 3 and all(type(item) is dict for item in value)


def _differing(records: list[dict[str, Any]]) -> set[int]:
    """The records whose status is rare or bad, or that hold an error anywhere inside."""
    found: set[int] = set()
    for key in _status_keys(records):
        values = [_hashable(record.get(key)) for record in records]
        counts = Counter(values)
        mode = counts.most_common(1)[0][0]
        rare = len(records) * MINORITY
        # Each distinct value tested once (a record's is one of a few); strings only, as no
        # other value but False is bad, and only a string is equal to a string.
        bad = {v for v in counts if isinstance(v, str) and is_salient_text(v)}
        found.update(
            i
            for i, v in enumerate(values)
            if (v != mode and counts[v] <= rare) or v is False or (isinstance(v, str) and v in bad)
        )
    found.update(i for i in _with_error_words(records) if i not in found and _has_error(records[i]))
    return found


def _with_error_words(records: list[dict[str, Any]]) -> list[int]:
    """The records whose JSON holds an error word: the words are looked for once in all of
    them (a search a record is the slowest part of a 100 KB array)."""
    texts = [dumps(record) for record in records]
    offsets = error_offsets("\n".join(texts))
    if not offsets:
        return []
    ends = list(accumulate(len(text) + 1 for text in texts))
    return sorted({bisect.bisect_right(ends, offset) for offset in offsets})


def _has_error(value: Any) -> bool:
    """Whether an error key holds something, or a string an error, anywhere in `value`."""
    if isinstance(value, str):
        return is_salient_text(value)
    if not isinstance(value, dict | list):
        return False
    # Most records hold no error word at all, not even as a key: one search of their JSON.
    return is_salient_text(dumps(value)) and _holds_error(value)


def _holds_error(value: Any) -> bool:
    if isinstance(value, str):
        return is_salient_text(value)
    if isinstance(value, dict):
        return any(
            item not in (None, "", [], {}, False, 0)
            if key.lower() in ERROR_KEYS
            else _holds_error(item)
            for key, item in value.items()
        )
    if isinstance(value, list):
        return any(_holds_error(item) for item in value)
    return False


def _salient_items(items: list[Any]) -> set[int]:
    return {i for i, item in enumerate(items) if _has_error(item)}


def _walk_records(value: Any, visit: Callable[[list[Any], int], None]) -> None:
    if isinstance(value, dict):
        for item in value.values():
            _walk_records(item, visit)
    elif isinstance(value, list):
        if _is_records(value):
            for index in sorted(_differing(value)):
                visit(value, index)
        else:
            for item in value:
                _walk_records(item, visit)
