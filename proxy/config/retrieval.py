"""A policy's retrieval tool: elided tool outputs kept, and a tool the proxy adds and answers
to read them back (docs/retrieval.md)."""

from __future__ import annotations

import dataclasses
import re

import policies

TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # what every API takes as a function's name


@dataclasses.dataclass(frozen=True)
class StoredOriginals:
    """The store's bounds of the kept originals (`store.originals`): a session's bytes, and
    the memory store's in all (a Redis server's: its maxmemory)."""

    session_bytes: int = 4 * 1024 * 1024
    total_bytes: int = 256 * 1024 * 1024


@dataclasses.dataclass(frozen=True)
class Retrieval:
    """Elided tool outputs kept, and a tool the proxy adds and answers to read them back
    (docs/retrieval.md)."""

    enabled: bool = False
    tool_name: str = "compaction_retrieve"
    description: str = (
        "Read back a tool output that was shortened to fit the context window: give the "
        "handle its marker names (handle=...), and optionally a line range. Answered at once."
    )
    max_rounds: int = 3  # the proxy's own calls of the tool answered per request
    max_result_chars: int = 20_000  # of an original one call returns

    def problems(self) -> list[tuple[str, str]]:
        """Each key that is wrong, with what is wrong with it."""
        found = []
        if not TOOL_NAME.fullmatch(self.tool_name):
            found.append(("tool_name", "must be 1 to 64 letters, digits, _ or -"))
        if not self.description.strip():
            found.append(("description", "must not be empty"))
        if self.max_rounds < 1:
            found.append(("max_rounds", "must be at least 1"))
        if self.max_result_chars < 100:
            found.append(("max_result_chars", "must be at least 100"))
        return found


def results_kept(compaction: policies.Policy, retrieval: Retrieval) -> policies.Policy:
    """The engine's policy with the retrieval tool's results out of every layer's reach that
    selects outputs by tool (`deny_tools`): they are never compressed, cleared or truncated
    (only evicted with their round)."""
    if not retrieval.enabled:
        return compaction
    layers: list[policies.LayerSpec] = []
    for name, params in compaction.layers:
        denied = getattr(params, "deny_tools", None)
        if isinstance(denied, tuple) and retrieval.tool_name not in denied:
            params = dataclasses.replace(params, deny_tools=(*denied, retrieval.tool_name))
        layers.append(policies.LayerSpec(name, params))
    return dataclasses.replace(compaction, layers=tuple(layers))
