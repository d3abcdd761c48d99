"""The layering of the code, as contracts checked on every import, those made only for type
checkers (`if TYPE_CHECKING:`) and inside functions included:

- `policies` (the pure engine) never imports `proxy`, nor a framework or anything that does I/O;
- `proxy`'s subpackages form layers, each importing only those below it (`LAYERS`); the two
  of a layer are independent of each other (the session store and the upstreams know nothing
  of one another);
- the transports towards the upstreams never import the engine;
- no module imports itself back through others (no cycle).

A wrong-way import fails here with the import's file and line.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Highest first. A module may import its own subpackage and any layer below its own.
LAYERS: list[tuple[str, ...]] = [
    ("proxy.__main__",),
    ("proxy.tools",),
    ("proxy.server",),
    ("proxy.compaction",),
    ("proxy.sessions", "proxy.upstream"),
    ("proxy.observability",),
    ("proxy.dialects",),
    ("proxy.models",),
    ("proxy.memo", "proxy.credentials"),
    ("proxy.config",),
    ("proxy.errors",),
]
# What the engine may import besides itself: the standard library and these.
ENGINE_MAY_IMPORT = {"orjson"}
MAX_LINES = 400


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def source_modules() -> dict[str, Path]:
    return {
        module_name(path): path
        for package in ("proxy", "policies")
        for path in sorted((ROOT / package).rglob("*.py"))
    }


MODULES = source_modules()


def imports(name: str, path: Path) -> Iterator[tuple[str, int]]:
    """Every module `name` imports (its line too): `from a import b` is `a.b` when that is a
    module, else `a`; relative imports resolved."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                yield (sub if sub in MODULES else base), node.lineno


def layer(module: str) -> tuple[int, str] | None:
    """The rank of `module`'s layer (0 the highest) and the part of the layer it is in."""
    for rank, parts in enumerate(LAYERS):
        for part in parts:
            if module == part or module.startswith(part + "."):
                return rank, part
    return None


def wrong_way(importer: str, imported: str) -> str | None:
    """Why `importer` may not import `imported`, or None when it may."""
    if importer.startswith("policies"):
        top = imported.partition(".")[0]
        if top == "proxy":
            return "the engine never imports the service"
        if top not in ENGINE_MAY_IMPORT and top != "policies" and not is_standard(top):
            return f"the engine imports only the standard library and {sorted(ENGINE_MAY_IMPORT)}"
        if top in ("asyncio", "socket", "http", "urllib", "subprocess") and imported != "asyncio":
            return "the engine does no I/O"
        return None
    if importer.startswith("proxy.upstream") and imported.partition(".")[0] == "policies":
        return "the transports never import the engine"
    if not imported.startswith("proxy"):
        return None
    mine, theirs = layer(importer), layer(imported)
    if mine is None or theirs is None or mine[1] == theirs[1]:
        return None
    if theirs[0] < mine[0]:
        return f"{mine[1]} is below {theirs[1]}"
    if theirs[0] == mine[0]:
        return f"{mine[1]} and {theirs[1]} are independent"
    return None


def is_standard(top: str) -> bool:
    import sys

    return top in sys.stdlib_module_names or top == "__future__"


def graph() -> dict[str, set[str]]:
    return {
        name: {imported for imported, _ in imports(name, path) if imported in MODULES}
        for name, path in MODULES.items()
    }


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(edges[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_every_import_points_down_the_layers() -> None:
    wrong = [
        f"{path.relative_to(ROOT)}:{line}: {name} imports {imported}: {why}"
        for name, path in MODULES.items()
        for imported, line in imports(name, path)
        if (why := wrong_way(name, imported))
    ]
    assert not wrong, "\n".join(wrong)


def test_no_import_cycle() -> None:
    assert cycles(graph()) == []


def test_every_subpackage_of_proxy_is_in_a_layer() -> None:
    assert [name for name in MODULES if name.startswith("proxy.") and layer(name) is None] == []


def test_proxy_keeps_few_modules_at_its_top() -> None:
    top = [p.name for p in (ROOT / "proxy").glob("*.py")]
    assert len(top) <= 12, top


def test_no_module_is_over_the_line_limit() -> None:
    long = {
        str(path.relative_to(ROOT)): count
        for path in MODULES.values()
        if (count := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}


@pytest.mark.parametrize(
    ("importer", "imported", "why"),
    [
        ("proxy.dialects.anthropic.messages", "proxy.server.tenants", "below"),
        ("proxy.compaction.hooks", "proxy.server.admin", "below"),
        ("proxy.sessions.store", "proxy.upstream.http1", "independent"),
        ("proxy.upstream.client", "policies", "transports never import the engine"),
        ("policies.pipeline", "proxy.errors", "never imports the service"),
        ("policies.pipeline", "starlette", "only the standard library"),
    ],
)
def test_the_contracts_refuse_a_wrong_way_import(importer: str, imported: str, why: str) -> None:
    assert why in (wrong_way(importer, imported) or "")


def test_the_cycle_finder_finds_a_cycle_through_three_modules() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
