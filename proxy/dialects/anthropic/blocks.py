"""Anthropic Messages content blocks as the engine's canonical messages, and back.

One native message stands for one or more canonical messages:

- a user turn: one `tool` message per `tool_result` block (`tool_call_id` = `tool_use_id`),
  then one `user` message with its other blocks, when it has any;
- an assistant turn: one `assistant` message, its text as content and its `tool_use` blocks
  as `tool_calls` (the arguments are the input's JSON). Thinking blocks are left out: the
  API strips them from every turn but the one whose tool results are being answered, and
  that one's thinking is counted with the request's fixed tokens (`thinking_turn`), so a
  message's canonical form does not change when it stops being the last;
- a `system` message (mid-conversation, for the models that take it): a system message.

Blocks the engine cannot read (images, documents, server tool blocks, types this module does
not know) become opaque parts with an estimated token count. `rebuilt` maps the view back:
untouched native messages go out as received; an edited one keeps every block its edit does
not replace (thinking blocks, ids, `is_error`, `cache_control`, unknown fields).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from policies import Message, content_text
from policies.counting import DOCUMENT_BYTES_PER_TOKEN
from policies.message import call_arguments, tool_calls

Block = dict[str, Any]

THINKING = frozenset({"thinking", "redacted_thinking"})
# Estimates where no tokenizer can tell (Claude's is not public), documented in
# docs/anthropic.md: an image costs at most about 1600 tokens (1.15 megapixels / 750); a
# thinking block's signature, or a redacted thinking block, counts as a constant.
IMAGE_TOKENS = 1600
SIGNATURE_TOKENS = 16
REDACTED_THINKING_TOKENS = 256
CHARS_PER_TOKEN = 4


@dataclasses.dataclass
class BadBlock(Exception):
    """A message or block the canonical form cannot hold; `path` names it as the API does."""

    path: str
    expected: str


def canonical(message: Any, index: int) -> list[Message]:
    """The canonical messages native message `index` stands for (BadBlock when its shape is
    not the API's). One pass over the blocks: this runs for every message of every request."""
    if message.__class__ is not dict:
        raise BadBlock(f"messages.{index}", "a valid dictionary")
    role = message.get("role")
    if role not in ("user", "assistant", "system"):
        raise BadBlock(f"messages.{index}.role", "'user', 'assistant' or 'system'")
    content = message.get("content")
    if content.__class__ is str:
        return [message]  # already a canonical message
    if content.__class__ is not list:
        raise BadBlock(f"messages.{index}.content", "a valid list")
    parts: list[dict[str, Any]] = []
    out: list[Message] = []
    calls = []
    for position, block in enumerate(content):
        kind = block.get("type") if block.__class__ is dict else None
        if kind == "tool_result" and role == "user":
            out.append(_tool(block, (index, position)))
        elif kind == "tool_use" and role == "assistant":
            calls.append(_call(block, (index, position)))
        elif kind.__class__ is str and kind in THINKING:  # (a list is no key of a set)
            continue  # counted with the fixed tokens while kept (see the module's docstring)
        else:
            parts.append(_part(block, (index, position)))
    if role == "assistant":
        assistant: Message = {"role": "assistant", "content": parts or None}
        if calls:
            assistant["tool_calls"] = calls
        return [assistant]
    if parts or not out:
        out.append({"role": role, "content": parts})
    return out


def rebuilt(native: Block, shown: Sequence[tuple[Message, Message | None]]) -> Block | None:
    """`native` as the view shows its canonical messages: `shown` is each of them, in order,
    with its view (None: gone). None when nothing of the message remains."""
    content = native["content"]
    if isinstance(content, str):
        _, edit = shown[0]
        if edit is None:
            return None
        text = edit.get("content")
        return {**native, "content": text if isinstance(text, str) else content_text(text)}
    blocks: list[Block] = []
    for members, (original, edit) in zip(_members(native), shown, strict=True):
        if edit is None:
            continue
        if edit is original:
            blocks += members
        elif original.get("role") == "tool":
            blocks.append(_result_block(members[0], original, edit))
        else:
            blocks += _edited(members, original, edit)
    if not blocks or all(b.get("type") in THINKING for b in blocks):
        return None
    return {**native, "content": blocks}


def thinking_turn(messages: Sequence[Any]) -> tuple[int, list[Block]]:
    """Where the assistant turn whose thinking the API keeps in context starts, and those
    thinking blocks: the last assistant turn, when nothing but tool results follows it (the
    tool loop it is in). The next request strips them, so the prompt up to that turn is what
    the next request repeats. (len(messages), []) when no thinking is kept."""
    kept: list[Block] = []
    start = len(messages)
    after_tools = True
    for index in reversed(range(len(messages))):
        message = messages[index]
        role = message.get("role")
        content = message.get("content")
        blocks = content if isinstance(content, list) else ([content] if content else [])
        if role == "assistant":
            kept = [b for b in blocks if isinstance(b, dict) and b.get("type") in THINKING] + kept
            start, after_tools = index, False
        elif role == "system":
            continue
        elif not after_tools:
            break  # the user turn before the last assistant turn
        elif any(not isinstance(b, dict) or b.get("type") != "tool_result" for b in blocks):
            return len(messages), []
    return (start, kept) if kept else (len(messages), [])


Where = tuple[int, ...]  # a block's place: message, block, and block inside a tool result


def _path(where: Where, *rest: str) -> str:
    """The API's name of a place, made only for an error message."""
    path = f"messages.{where[0]}.content.{where[1]}"
    if len(where) > 2:
        path += f".tool_result.content.{where[2]}"
    return ".".join((path, *rest))


def _tool(block: Block, where: Where) -> Message:
    use_id = block.get("tool_use_id")
    if use_id.__class__ is not str:
        raise BadBlock(_path(where, "tool_result.tool_use_id"), "a valid string")
    inner = block.get("content")
    if inner.__class__ is list:
        inner = [_part(b, (*where, n)) for n, b in enumerate(inner)]
    elif inner is None:
        inner = ""
    elif inner.__class__ is not str:
        raise BadBlock(_path(where, "tool_result.content"), "a valid list")
    message: Message = {"role": "tool", "tool_call_id": use_id, "content": inner}
    if block.get("is_error") is True:  # a failed call: the engine never cuts it (is_error_result)
        message["is_error"] = True
    return message


def _call(block: Block, where: Where) -> dict[str, Any]:
    for name in ("id", "name"):
        if block.get(name).__class__ is not str:
            raise BadBlock(_path(where, "tool_use", name), "a valid string")
    if block.get("input").__class__ is not dict:
        raise BadBlock(_path(where, "tool_use.input"), "a valid dictionary")
    function = {"name": block["name"], "arguments": orjson.dumps(block["input"]).decode()}
    return {"id": block["id"], "type": "function", "function": function}


def _part(block: Any, where: Where) -> dict[str, Any]:
    """The canonical content part of a block: text, or opaque with its estimated tokens."""
    kind = block.get("type") if block.__class__ is dict else None
    if kind == "text":
        text = block.get("text")
        if text.__class__ is not str:
            raise BadBlock(_path(where, "text.text"), "a valid string")
        return {"type": "text", "text": text}
    if kind.__class__ is not str:
        raise BadBlock(_path(where), "a valid dictionary with a string 'type'")
    if kind == "image":
        return {"type": "opaque", "tokens": IMAGE_TOKENS}
    source = block.get("source")
    data = source.get("data") if kind == "document" and isinstance(source, dict) else None
    if isinstance(data, str) and source is not None and source.get("type") == "base64":
        return {"type": "opaque", "tokens": max(1, len(data) * 3 // 4 // DOCUMENT_BYTES_PER_TOKEN)}
    # Without its breakpoint: clients move theirs every turn, and a message's canonical form
    # must not change with it.
    unmarked = {k: v for k, v in block.items() if k != "cache_control"}
    return {"type": "opaque", "tokens": max(1, len(orjson.dumps(unmarked)) // CHARS_PER_TOKEN)}


def _members(native: Block) -> list[list[Block]]:
    """The native blocks of each canonical message `canonical` made of `native`, in order."""
    content: list[Block] = native["content"]
    if native["role"] != "user":
        return [content]
    members = [[b] for b in content if b["type"] == "tool_result"]
    if len(members) < len(content) or not content:
        members.append([b for b in content if b["type"] != "tool_result"])
    return members


def _result_block(block: Block, original: Message, edit: Message) -> Block:
    """A tool_result with its content as edited; tool_use_id, is_error and the rest kept."""
    content = block.get("content")
    nested = content if isinstance(content, list) else []
    new = _parts_back(nested, original.get("content"), edit.get("content"))
    if new is None:
        text = content_text(edit.get("content"))
        mark = _last_mark(nested)
        if mark is None or not text:
            return {**block, "content": text}
        return {**block, "content": [{"type": "text", "text": text, "cache_control": mark}]}
    return {**block, "content": [b for replaced in new for b in replaced]}


def _edited(blocks: list[Block], original: Message, edit: Message) -> list[Block]:
    """The blocks of a user, system or assistant message with its edit: tool_use blocks by
    call id, content blocks part by part; thinking blocks untouched."""
    calls = {call.get("id"): call for call in tool_calls(edit)}
    before = {call.get("id"): call for call in tool_calls(original)}
    assistant = original.get("role") == "assistant"
    holders = [b for b in blocks if not _kept_aside(b, assistant)]
    new = _parts_back(holders, original.get("content"), edit.get("content"))
    if new is None:  # the content was replaced whole: its text takes the first part's place
        text = content_text(edit.get("content"))
        mark = _last_mark(holders)
        first: list[Block] = [{"type": "text", "text": text}] if text else []
        if first and mark is not None:
            first[0]["cache_control"] = mark
        new = [first] + [[] for _ in holders[1:]]
    replacing = dict(zip(map(id, holders), new, strict=True))
    out: list[Block] = []
    for block in blocks:
        if block["type"] == "tool_use" and assistant:
            call = calls.get(block["id"])
            if call is None:
                continue
            arguments = call_arguments(call)
            if arguments != call_arguments(before.get(block["id"], {})):
                block = {**block, "input": _input(arguments)}
            out.append(block)
        elif block["type"] in THINKING:
            out.append(block)
        else:
            out += replacing[id(block)]
    return out


def _kept_aside(block: Block, assistant: bool) -> bool:
    """Whether a block made no content part: thinking, and an assistant's tool calls."""
    return block["type"] in THINKING or (assistant and block["type"] == "tool_use")


def _parts_back(blocks: list[Block], original: Any, edit: Any) -> list[list[Block]] | None:
    """What each of `blocks` (which made the parts of `original`) becomes in `edit`, part by
    part; None when the edit is not part by part (a string, or another number of parts)."""
    if edit is original:
        return [[b] for b in blocks]
    if not (isinstance(edit, list) and isinstance(original, list) and len(edit) == len(blocks)):
        return None
    out = []
    for block, before, after in zip(blocks, original, edit, strict=True):
        if after is before or after == before:
            out.append([block])
        elif isinstance(after, dict) and after.get("type") == "text":
            replaced = {"type": "text", "text": after.get("text", "")}
            if "cache_control" in block:
                replaced["cache_control"] = block["cache_control"]
            out.append([replaced] if replaced["text"] else [])
        else:
            out.append([block])
    return out


def _last_mark(blocks: Sequence[Mapping[str, Any]]) -> Any:
    """The last cache breakpoint among `blocks` (kept when they are replaced)."""
    marks = [b["cache_control"] for b in blocks if isinstance(b, dict) and b.get("cache_control")]
    return marks[-1] if marks else None


def _input(arguments: str) -> dict[str, Any]:
    """A tool_use input from edited arguments: the API only takes a JSON object, so anything
    else (a truncated head) is wrapped as `{"_truncated": text}`."""
    try:
        value = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        value = None
    return value if isinstance(value, dict) else {"_truncated": arguments}
