"""Prompt-cache breakpoints of an Anthropic Messages request: the client's, and the proxy's own.

Anthropic caches a prompt only up to explicit `cache_control` breakpoints (at most 4, counted
over `tools`, `system` and `messages` in that order, a 1-hour one never after a 5-minute one),
and a breakpoint only finds an earlier cache entry within about 20 blocks before it. The
proxy knows where its view stays byte-identical between compactions, so it adds breakpoints
there, in the slots the client left free: the client's own are never moved or removed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from proxy.dialects.anthropic.blocks import THINKING, Block

MAX_BREAKPOINTS = 4
BREAKPOINT = b'"cache_control"'  # the key of one, in JSON
ONE_HOUR = "1h"


def with_breakpoints(
    body: Mapping[str, Any], taken: int, messages: list[Block], marks: Sequence[int]
) -> list[Block]:
    """`messages` with a breakpoint added on each message at `marks` (in order of priority)
    that has none yet, while the request, whose own bytes hold `taken` keys of breakpoints,
    has free slots. Each added breakpoint lasts as long as the longest one after it, so that
    the order of TTLs stays valid."""
    # The client's breakpoints, counted in its own bytes: a key of that name inside a tool's
    # input counts too, which only ever leaves a slot unused.
    free = MAX_BREAKPOINTS - taken
    automatic = body.get("cache_control")
    out = list(messages)
    for index in marks:
        if free <= 0:
            break
        if _ttls(out[index].get("content")) or (automatic and index == len(out) - 1):
            continue
        mark: dict[str, Any] = {"type": "ephemeral"}
        # Read where it may be (system and tools come first), not looked for in the bytes:
        # a search of them costs more, and misses a TTL written with escapes.
        if _hour_after(automatic, out[index + 1 :]):
            mark["ttl"] = ONE_HOUR
        marked = _marked(out[index], mark)
        if marked is not None:
            out[index] = marked
            free -= 1
    return out


def _hour_after(automatic: Any, messages: list[Block]) -> bool:
    """Whether a one-hour breakpoint follows (in the messages, or the automatic one)."""
    if isinstance(automatic, dict) and automatic.get("ttl") == ONE_HOUR:
        return True
    return any(ONE_HOUR in _ttls(message.get("content")) for message in messages)


def _marked(message: Block, mark: dict[str, Any]) -> Block | None:
    """The message with `mark` on its last block that takes one (thinking blocks do not);
    None when it has no such block."""
    content = message.get("content")
    if isinstance(content, str):
        if not content:
            return None
        return {**message, "content": [{"type": "text", "text": content, "cache_control": mark}]}
    if not isinstance(content, list):
        return None
    for position in reversed(range(len(content))):
        block = content[position]
        if isinstance(block, dict) and block.get("type") not in THINKING:
            blocks = list(content)
            blocks[position] = {**block, "cache_control": mark}
            return {**message, "content": blocks}
    return None


def _ttls(content: Any) -> list[str]:
    """The TTLs of the breakpoints in a list of blocks (tools, system or a message's content,
    tool results' own content included), in order."""
    if not isinstance(content, list):
        return []
    found = []
    for block in content:
        if not isinstance(block, dict):
            continue
        mark = block.get("cache_control")
        if isinstance(mark, dict):
            found.append(str(mark.get("ttl", "5m")))
        found += _ttls(block.get("content"))
    return found
