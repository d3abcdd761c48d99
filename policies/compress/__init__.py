"""Tool output compression: content detected, not configured; deterministic; errors never cut.

`compress(text, budget)` detects what the output is and compresses it: with no budget, only
losslessly (compact JSON with arrays of records as tables, a search grouped by file, runs of a
repeated line collapsed); with a budget in characters, to about that size, lossless when the
lossless form fits. It begins with a `Marker` that says it is compressed and what was elided.
The same text, budget and limits always give the same bytes (plans replay them, and provider
caches keep hitting), and the result is always shorter than the text, or None.

`salient_lines(text)` is what must stay visible when the output itself goes: its error and
failure lines and its findings (the lines that stand out of a templated output, see
`findings`), or the JSON records that differ from the rest, each a verbatim piece of what the
compressed form keeps.
"""

from __future__ import annotations

from typing import Any

from policies.compress import formats, json_form
from policies.compress.findings import finding_indices, finding_lines
from policies.compress.limits import Limits
from policies.compress.lines import Shrunk, collapse_repeats, compress_lines
from policies.compress.marker import PREFIX, Marker
from policies.compress.salience import error_lines, has_warning

KINDS = ("json", "search", "diff", "html", "blob", "log", "text")
SALIENT_LINES = 8  # at most this many salient lines an output…
SALIENT_CHARS = 240  # …each at most this long (its beginning)
_BLOB_SHARE = 0.5  # an output that is more than half blobs is a blob
DEFAULT_LIMITS = Limits()

__all__ = [
    "KINDS",
    "PREFIX",
    "Compressed",
    "Limits",
    "Marker",
    "compress",
    "detect",
    "finding_lines",
]


class Compressed:
    """A compressed output: the text that replaces it (marker first) and its kind."""

    __slots__ = ("kind", "marker", "text")

    def __init__(self, text: str, kind: str, marker: Marker) -> None:
        self.text = text
        self.kind = kind
        self.marker = marker


def detect(text: str, limits: Limits = DEFAULT_LIMITS) -> str:
    """The kind of a tool output: one of KINDS."""
    return _detect(text, limits)[0]


def compress(
    text: str,
    budget: int | None,
    *,
    kinds: tuple[str, ...] = KINDS,
    limits: Limits = DEFAULT_LIMITS,
) -> Compressed | None:
    """`text` compressed losslessly (`budget` None) or to about `budget` characters; None when
    its kind is not in `kinds`, it is already compressed, or no form of it is shorter."""
    if text.startswith(PREFIX) or text.startswith('{"compressed":"' + PREFIX):
        return None
    kind, value = _detect(text, limits)
    if kind not in kinds:
        return None
    if kind == "json":
        compressed = _json(text, value, budget, limits)
    else:
        shrunk = _lossless(kind, text, budget)
        if budget is not None and (shrunk is None or len(shrunk.body) > budget):
            shrunk = _lossy(kind, text, budget, limits)
        compressed = None if shrunk is None else _marked(text, kind, shrunk)
    return compressed if compressed is not None and len(compressed.text) < len(text) else None


def salient_lines(
    text: str, *, is_error: bool = False, limits: Limits = DEFAULT_LIMITS
) -> list[str]:
    """The lines of `text` that must stay visible when it is removed (see the module's
    docstring); with `is_error` (the output is an error as a whole), its first lines."""
    if is_error:
        picked = [line.strip() for line in text.split("\n") if line.strip()]
    else:
        kind, value = _detect(text, limits)
        if kind == "json" and not isinstance(value, str):
            picked = json_form.salient_records(value)
        elif kind == "diff":
            return []
        else:
            lines = text.split("\n")
            indices = sorted({*error_lines(text), *finding_indices(lines)})
            found = dict.fromkeys(lines[i].strip() for i in indices)
            picked = [line for line in found if line]
    if len(picked) > SALIENT_LINES:  # the first errors (the cause) and the last (the outcome)
        picked = picked[:3] + picked[3 - SALIENT_LINES :]
    return [line[:SALIENT_CHARS] for line in picked]


def _detect(text: str, limits: Limits) -> tuple[str, Any]:
    try:
        return "json", json_form.parse(text)
    except ValueError:
        pass
    if formats.is_diff(text):
        return "diff", None
    if formats.is_html(text):
        return "html", None
    if formats.is_search(text.split("\n")):
        return "search", None
    if formats.blob_share(text, limits) > _BLOB_SHARE:
        return "blob", None
    if error_lines(text) or has_warning(text):
        return "log", None
    return "text", None


def _json(text: str, value: Any, budget: int | None, limits: Limits) -> Compressed | None:
    plain = json_form.dumps(value)
    table = json_form.dumps(json_form.tables(value))
    shrunk = Shrunk(table, "") if len(table) < len(plain) else Shrunk(plain, "")
    if budget is not None and len(shrunk.body) > budget:
        shrunk = json_form.shrink(value, budget, limits)
    marker = Marker("json", len(text), shrunk.elided)
    form = ',"form":"arrays of records as columns and rows"' if shrunk.body is table else ""
    head = f'{{"compressed":{json_form.dumps(marker.render())}{form}'
    return Compressed(f'{head},"data":{shrunk.body}}}', "json", marker)


def _lossless(kind: str, text: str, budget: int | None) -> Shrunk | None:
    """The lossless form (None when there is none, or, for a search, when it is over
    `budget`: it is then not made)."""
    if kind == "search":
        if budget is not None and formats.search_size(text, None) > budget:
            return None
        body, _ = formats.render(formats.search_groups(text), None, formats.SEARCH_MORE)
        return Shrunk(body, "")
    return collapse_repeats(text)


def _lossy(kind: str, text: str, budget: int, limits: Limits) -> Shrunk:
    if kind == "diff":
        return formats.compress_diff(text, budget, limits)
    if kind == "search":
        return formats.compress_search(text, budget, limits)
    notes = []
    if kind == "html":
        text = formats.html_text(text)
        notes.append("markup")
    text, blobs = formats.elide_blobs(text, limits)
    if blobs:
        notes.append(f"{blobs} blobs")
    shrunk = compress_lines(text, budget, limits) if len(text) > budget else Shrunk(text, "")
    return Shrunk(shrunk.body, ", ".join(note for note in (*notes, shrunk.elided) if note))


def _marked(text: str, kind: str, shrunk: Shrunk) -> Compressed:
    marker = Marker(kind, len(text), shrunk.elided)
    return Compressed(f"{marker.render()}\n{shrunk.body}", kind, marker)
