"""The defaults the docs state are the schema's: every row of a `| key | default | meaning |`
table in docs/config.md and docs/compaction.md against the dataclass default of its key, and
every key of a documented section in its tables. A literal default (`8080`, `true`, `memory://`)
must equal the schema's; `(required)` is a key without one; words (`none`, `the request's`,
`see below`) stand for a default decided elsewhere, which the schema leaves empty."""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

import policies
from policies.layers import LAYERS
from proxy import config as schema

DOCS = Path(__file__).resolve().parent.parent / "docs"
REQUIRED = object()  # a field without a default


def defaults(cls: type, prefix: str = "") -> dict[str, Any]:
    """The dataclass's keys as a config file spells them, each with its default (REQUIRED
    where there is none)."""
    found: dict[str, Any] = {}
    for field in dataclasses.fields(cls):
        if not field.init:
            continue
        if field.default is not dataclasses.MISSING:
            found[prefix + field.name] = field.default
        elif field.default_factory is not dataclasses.MISSING:
            found[prefix + field.name] = field.default_factory()
        else:
            found[prefix + field.name] = REQUIRED
    return found


def sections() -> dict[str, dict[str, Any]]:
    """Each documented section: its keys and their defaults."""
    upstream = defaults(schema.Upstream)
    del upstream["timeouts"]  # documented key by key
    policy = defaults(schema.Policy) | defaults(policies.Policy)
    del policy["compaction"]  # the engine's keys, flat in a policy (policies.Policy)
    admin = defaults(schema.Admin)
    del admin["dashboard"]  # documented key by key
    found = {
        "listen": defaults(schema.Listen),
        "store": defaults(schema.Store),
        "sessions": defaults(schema.Sessions),
        "auth": defaults(schema.Auth),
        "upstreams": upstream | defaults(schema.Timeouts, "timeouts."),
        "models": defaults(schema.ModelOverride),
        "policies": policy,
        "summarizer": defaults(schema.Summarizer),
        "exact_count": defaults(schema.ExactCount),
        "retrieval": defaults(schema.Retrieval),
        "originals": defaults(schema.StoredOriginals),
        "routes": defaults(schema.Route),
        "admin": admin | defaults(schema.Dashboard, "dashboard."),
        "compaction_items": defaults(schema.CompactionItems),
        "hooks": defaults(schema.Hooks),
        "hook": defaults(schema.Hook),
        "logging": defaults(schema.Logging),
    }
    return found | {name: defaults(layer.params) for name, layer in LAYERS.items()}


# Keys documented otherwise than in a table: the policy's `layers` by the YAML of
# docs/compaction.md's "The plan".
NOT_IN_TABLES = {("policies", "layers")}


@dataclasses.dataclass(frozen=True)
class Row:
    document: str
    key: str
    default: str  # the cell as written


def tables(document: str) -> list[list[Row]]:
    """The tables of `document` whose second column is the default, their rows keyed by a
    key in backticks (others, such as "compaction keys", point elsewhere)."""
    found: list[list[Row]] = []
    rows: list[Row] | None = None
    for line in (DOCS / document).read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if not line.startswith("|"):
            rows = None
        elif rows is None and len(cells) > 1 and cells[1] == "default":
            rows = []
            found.append(rows)
        elif rows is not None and (key := re.fullmatch(r"`([a-z_.]+)`", cells[0])):
            rows.append(Row(document, key[1], cells[1]))
    return found


def section_of(table: list[Row], known: dict[str, dict[str, Any]]) -> str:
    """The one section that has every key of the table."""
    names = [name for name, keys in known.items() if {row.key for row in table} <= keys.keys()]
    assert len(names) == 1, f"{[row.key for row in table]} fit {names or 'no section'}"
    return names[0]


def literal(cell: str) -> str | None:
    """The value a cell states: one code span, or a bare number; None for words."""
    code = re.fullmatch(r"`([^`]*)`", cell)
    if code:
        return code[1]
    return cell if re.fullmatch(r"-?[0-9][0-9_.]*", cell) else None


def same(written: str, default: Any) -> bool:
    """Whether `written` (as in a config file) is `default`."""
    if isinstance(default, str):
        return written == default
    parsed = yaml.safe_load(written)
    if isinstance(default, bool) or default is None:
        return parsed is default
    if isinstance(default, int | float):
        number = isinstance(parsed, int | float) and not isinstance(parsed, bool)
        return number and math.isclose(parsed, default)
    if dataclasses.is_dataclass(default) and not isinstance(default, type):
        return bool(parsed == dataclasses.asdict(default))
    return bool(parsed == (list(default) if isinstance(default, tuple) else default))


def check(row: Row, default: Any) -> str | None:
    """What is wrong with the row's default, if anything."""
    where = f"{row.document}: `{row.key}` says {row.default!r}"
    if row.default == "(required)":
        # base_url is required of every kind but litellm: its schema default is empty.
        return None if default is REQUIRED or default == "" else f"{where}, the schema {default!r}"
    if default is REQUIRED:
        return f"{where}, the schema requires it"
    written = literal(row.default)
    if written is not None:
        return None if same(written, default) else f"{where}, the schema {default!r}"
    # Words: a default decided elsewhere (the request's, litellm's map, a section below).
    decided = default in (None, (), {}) or dataclasses.is_dataclass(default)
    return None if decided else f"{where}, the schema {default!r}"


DOCUMENTED = [table for document in ("config.md", "compaction.md") for table in tables(document)]


def test_the_docs_have_default_tables() -> None:
    assert len(DOCUMENTED) >= 15
    assert all(DOCUMENTED)


def first_key(table: list[Row]) -> str:
    return f"{table[0].document}:{table[0].key}" if table else "empty"


@pytest.mark.parametrize("table", DOCUMENTED, ids=first_key)
def test_each_documented_default_is_the_schemas(table: list[Row]) -> None:
    known = sections()
    keys = known[section_of(table, known)]
    problems = [problem for row in table if (problem := check(row, keys[row.key]))]
    assert problems == []


def test_each_key_of_a_documented_section_is_in_its_tables() -> None:
    known = sections()
    documented: dict[str, set[str]] = {}
    for table in DOCUMENTED:
        documented.setdefault(section_of(table, known), set()).update(row.key for row in table)
    missing = {
        (name, key)
        for name, keys in documented.items()
        for key in known[name].keys() - keys
        if (name, key) not in NOT_IN_TABLES
    }
    assert missing == set()
