"""A layer's edit of a canonical message of the Responses API written back as input items
(`responses_items` maps the items to canonical messages): only the fields the edit replaced
change, the parts it kept go as received, and what it removed goes with what it produced.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from policies import Message
from policies.message import call_arguments, tool_calls
from proxy.dialects.openai.responses_items import (
    ARGUMENTS,
    CALLS,
    MODEL_OUTPUTS,
    OUTPUTS,
    is_editable,
    item_type,
)


def edited_items(items: Sequence[Any], original: Message, edited: Message) -> list[Any]:
    """The items of a canonical message a layer edited: only the fields the edit replaced."""
    role = original["role"]
    if role == "assistant":
        return _edited_group(items, original, edited)
    head = next(j for j, item in enumerate(items) if _made(item, role))
    item = items[head]
    field = "output" if role == "tool" else "content"
    out = list(items)
    if is_editable(item.get(field)):  # a screenshot is never edited in place
        native = native_content(edited.get("content"), original.get("content"), item[field])
        out[head] = {**item, field: native}
    return out


def _made(item: Mapping[str, Any], role: str) -> bool:
    """Whether `item` is the one a canonical message of `role` was made from (the others in
    its span are kept with it)."""
    kind = item_type(item)
    return kind in OUTPUTS if role == "tool" else kind == "message" and item.get("role") == role


def native_content(new: Any, old: Any, native: Any) -> Any:
    """`new`, an edit of the canonical content `old` of `native`, in native parts: the parts
    it kept as they were received, new text as input_text, kept items' costs left out."""
    if not isinstance(new, list) or not isinstance(old, list):
        return new
    natives = native if isinstance(native, list) else [{"type": "input_text", "text": native}]
    received = dict(zip(map(id, old), natives, strict=False))
    known = set(map(id, old))
    out = []
    for part in new:
        if id(part) in received:
            out.append(received[id(part)])
        elif id(part) in known:
            continue  # the cost of an item kept with this message, not content
        elif part.get("type") == "text":
            out.append({"type": "input_text", "text": part["text"]})
        else:
            out.append(part)
    return out


def _edited_group(items: Sequence[Any], original: Message, edited: Message) -> list[Any]:
    """Call items the edit removed go, truncated arguments are written back, and a reasoning
    item goes when everything it produced went. The assistant's text is never edited."""
    before = {call["id"]: call for call in tool_calls(original)}
    after = {call["id"]: call for call in tool_calls(edited)}
    kept: list[Any] = []
    for item in items:
        kind = item_type(item)
        if kind in CALLS:
            call = after.get(item["call_id"])
            if call is None:
                item = None
            elif (arguments := call_arguments(call)) != call_arguments(before[item["call_id"]]):
                item = {**item, ARGUMENTS[kind]: arguments}
        kept.append(item)
    return [
        item
        for j, item in enumerate(kept)
        if item is not None
        and (item_type(item) != "reasoning" or _produced_survives(items, kept, j))
    ]


def _produced_survives(items: Sequence[Any], kept: list[Any], at: int) -> bool:
    """Whether what the reasoning item at `at` produced (the model output after it, up to the
    next reasoning item) is still there, or it produced nothing."""
    produced = []
    for j in range(at + 1, len(items)):
        kind = item_type(items[j])
        if kind == "reasoning":
            break
        if kind in CALLS or kind in MODEL_OUTPUTS or kind == "message":
            produced.append(j)
    return not produced or any(kept[j] is not None for j in produced)
