"""The Responses API's input items as the engine's canonical messages (and back, of an edited
message: `responses_edits`).

    message, role system / developer      a system / developer message (kept verbatim)
    message, role user                    a user message: input_text -> text,
                                          input_image -> image_url, input_file -> file
    a run of model output: assistant      ONE assistant message: the assistant's text, a tool
      messages, reasoning, calls,         call for each call a client answers, the rest as
      server-side tool calls,             parts no layer edits; so a reasoning item goes
      item references                     wherever the calls after it go
    an output answering a call of the     a tool message (its output text or parts)
      assistant message just before
    compaction (the provider's own)       a system message: pinned, never edited
    anything else                         kept verbatim with the message before it (the
                                          next one when first), never edited

What no layer may remove stays in the message whose content no layer replaces: the message
itself, or for a tool message the assistant message of its block (a screenshot, an item kept
with a tool output). Opaque payloads (encrypted content, item references) cost
`OPAQUE_ITEM_TOKENS` as an opaque part; items the proxy does not know cost their JSON.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from policies import Message, media_tokens
from policies.message import SYSTEM_ROLES
from proxy.dialects.json_checks import BadField, all_typed_objects, check_string, invalid_type
from proxy.memo import content_keys

OPAQUE_ITEM_TOKENS = 64  # an encrypted reasoning or compaction item, an item reference
# The calls a client answers, and the outputs that answer them.
CALLS = frozenset(
    {
        "function_call",
        "custom_tool_call",
        "local_shell_call",
        "computer_call",
        "shell_call",
        "apply_patch_call",
    }
)
OUTPUTS = frozenset(f"{call}_output" for call in CALLS)
# What else only the model produces: it travels with the model's calls and text.
MODEL_OUTPUTS = frozenset(
    {
        "reasoning",
        "web_search_call",
        "file_search_call",
        "image_generation_call",
        "code_interpreter_call",
        "mcp_call",
        "mcp_list_tools",
        "mcp_approval_request",
        "item_reference",
    }
)
# Fields whose payload nobody can read: they cost OPAQUE_ITEM_TOKENS, not their length.
_OPAQUE_FIELDS = {"encrypted_content": "*", "result": "image_generation_call"}
_TEXT_PARTS = ("input_text", "output_text")
# Where a call item holds the text its canonical call's arguments stand for; structured
# calls have none (their action is an object, which no layer truncates).
ARGUMENTS = {"function_call": "arguments", "custom_tool_call": "input"}


def item_type(item: Mapping[str, Any]) -> str:
    """An item's type; without one, a message when it has a role, else an item reference."""
    kind = item.get("type")
    if kind is None:
        return "message" if "role" in item else "item_reference"
    return kind if isinstance(kind, str) else ""


def opaque(tokens: int = OPAQUE_ITEM_TOKENS) -> dict[str, Any]:
    return {"type": "opaque", "tokens": tokens}


@dataclasses.dataclass(frozen=True)
class Mapped:
    """The canonical messages of the first `count` items, the items each stands for and the
    content key of each (`proxy.memo`); and where the fold stood after them, to go on from
    when more items follow (`map_items(after=...)`). Never changed once made: later folds copy
    what they change."""

    messages: list[Message]
    spans: list[slice]
    keys: list[int]
    count: int
    fold: _Fold | None = None  # None: a later fold starts over (see `_Builder.finish`)


class _Fold(NamedTuple):
    group: int | None
    block: int | None
    answers: dict[str, str]


def map_items(items: Sequence[Any], after: Mapped | None = None) -> Mapped:
    """The canonical messages of `items` and the items each stands for; InvalidRequest when
    a field compaction reads has the wrong type. With `after`, the mapping of the first items
    of `items` (the same items: a turn of a conversation already read), only the items after
    them are read: the history costs a copy of its lists, not a pass over its messages (and
    nothing when no item follows them: `after` itself)."""
    if after is not None and after.fold is not None and after.count == len(items):
        return after
    builder = _Builder(after)
    for index in range(builder.count, len(items)):
        item = items[index]
        if not isinstance(item, dict):
            raise invalid_type(f"input[{index}]", "an object", item)
        try:
            builder.add(index, item)
        except BadField as bad:
            raise invalid_type(f"input[{index}]{bad.path}", bad.expected, bad.value) from None
    return builder.finish(len(items))


class _Builder:
    """The fold of items into canonical messages. Resumed from a mapping, it changes none of
    that mapping's messages in place: a message it adds to is copied first (`_own`)."""

    def __init__(self, after: Mapped | None) -> None:
        self.lead: list[dict[str, Any]] = []  # parts of items before the first message
        self.owned: set[int] = set()  # the messages this fold made or copied
        if after is None or after.fold is None:
            self.count = 0
            self.messages: list[Message] = []
            self.keys: list[int] = []
            self.spans: list[slice] = []
            self.starts: list[int] = []  # where each message from `spans`' end on begins
            self.group: int | None = None  # the assistant message model output goes to
            self.block: int | None = None  # the assistant message whose calls are answered
            self.answers: dict[str, str] = {}  # its calls: call_id (or item id) -> call_id
            return
        fold = after.fold
        self.count = after.count
        self.messages, self.keys = list(after.messages), list(after.keys)
        self.spans = after.spans[:-1]  # the last one ends where the items do
        self.starts = [span.start for span in after.spans[-1:]]
        self.group, self.block, self.answers = fold.group, fold.block, dict(fold.answers)

    def add(self, index: int, item: dict[str, Any]) -> None:
        kind = item_type(item)
        if kind == "message":
            self._message(index, item)
        elif kind in CALLS:
            self._model_output(index, [], _call(item, kind))
        elif kind in MODEL_OUTPUTS:
            self._model_output(index, _opaque_parts(item, kind), None)
        elif kind in OUTPUTS:
            self._answer(index, item, kind)
        elif kind == "compaction":
            self._new(index, {"role": "system", "content": [opaque()]}, block=None)
        else:
            self._attach(_opaque_parts(item, kind))

    def finish(self, count: int) -> Mapped:
        # Nothing but items the proxy does not know: one pinned message. A later item that
        # makes a message would take these parts instead, so such a mapping is not resumed.
        resumable = not self.lead
        if self.lead:
            self._new(0, {"role": "system", "content": []}, block=None)
        self.keys += [0] * (len(self.messages) - len(self.keys))
        owned = list(self.owned)
        for at in owned:
            message = self.messages[at]
            if message["role"] == "assistant" and not message["content"]:
                message["content"] = None
        for at, key in zip(owned, content_keys([self.messages[at] for at in owned]), strict=True):
            self.keys[at] = key
        if self.starts:  # no item, no message
            stops = [*self.starts[1:], count]
            self.spans += [slice(a, b) for a, b in zip(self.starts, stops, strict=True)]
        fold = _Fold(self.group, self.block, self.answers) if resumable else None
        return Mapped(self.messages, self.spans, self.keys, count, fold)

    def _own(self, at: int) -> Message:
        """Message `at`, to change: a copy when it is the mapping's this fold resumed."""
        if at in self.owned:
            return self.messages[at]
        message = self.messages[at]
        content = message["content"]
        copy = {**message, "content": [] if content is None else _copied(content)}
        if "tool_calls" in message:
            copy["tool_calls"] = list(message["tool_calls"])
        self.messages[at] = copy
        self.owned.add(at)
        return copy

    def _new(self, index: int, message: Message, *, block: int | None) -> None:
        """A new canonical message: it ends the run of model output; `block` is the assistant
        message whose answers may follow."""
        self.group, self.block = None, block
        self.starts.append(index if self.messages else 0)
        self.owned.add(len(self.messages))
        self.messages.append(message)
        if self.lead:
            self._attach(self.lead)
            self.lead = []

    def _message(self, index: int, item: dict[str, Any]) -> None:
        role = item.get("role")
        check_string(role, ".role")
        content = canonical_content(item.get("content"), ".content")
        if role == "assistant":
            self._model_output(
                index, [_text(content)] if isinstance(content, str) else content, None
            )
        elif role == "user" or role in SYSTEM_ROLES:
            self._new(index, {"role": role, "content": content}, block=None)
        else:  # not a role the API knows: the upstream says so
            self._attach(_opaque_parts(item, "message"))

    def _model_output(self, index: int, parts: list[Any], call: dict[str, Any] | None) -> None:
        if self.group is None:
            self.answers = {}
            group = len(self.messages)
            self._new(index, {"role": "assistant", "content": []}, block=group)
            self.group = group
        message = self._own(self.group)
        message["content"] += parts
        if call is not None:
            message.setdefault("tool_calls", []).append(call)
            self.answers.update(dict.fromkeys(call_keys(call), call["id"]))

    def _answer(self, index: int, item: dict[str, Any], kind: str) -> None:
        for field in ("call_id", "id"):
            check_string(item.get(field), f".{field}")
        call_id = self.answers.get(item.get("call_id") or item.get("id") or "")
        if call_id is None or self.block is None:
            # Its call is not the one just before (a reference, a stored call): it stays
            # with what precedes it, so no cut can part them.
            self._attach(_opaque_parts(item, kind))
            return
        block = self.block
        content, cost = output_content(item.get("output"), kind)
        self._new(index, {"role": "tool", "tool_call_id": call_id, "content": content}, block=block)
        if cost:
            self._own(block)["content"] += cost

    def _attach(self, parts: list[dict[str, Any]]) -> None:
        """Parts of an item kept with the message before it, where no layer removes them."""
        if not self.messages:
            self.lead += parts
            return
        at = len(self.messages) - 1
        if self.messages[at]["role"] == "tool" and self.block is not None:
            at = self.block
        message = self._own(at)
        content = message["content"]
        message["content"] = [*([_text(content)] if isinstance(content, str) else content), *parts]


def _call(item: dict[str, Any], kind: str) -> dict[str, Any]:
    """The canonical tool call of a call item (the caller records its answers)."""
    call_id = item.get("call_id")
    if not isinstance(call_id, str):
        raise BadField(".call_id", "a string", call_id)
    check_string(item.get("name"), ".name")
    field = ARGUMENTS.get(kind)
    if field is not None:
        check_string(item.get(field), f".{field}")
        name, arguments = item.get("name"), item.get(field)
    else:
        # A structured action (a shell command, a click, a patch operation) cannot be cut and
        # stay valid: as an object rather than text no layer truncates it.
        name = kind.removesuffix("_call")
        arguments = {k: v for k, v in item.items() if k not in ("type", "call_id", "status")}
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def call_keys(call: Mapping[str, Any]) -> list[str]:
    """What an output may name a canonical call by: its call_id, and a local shell call's id
    (a local_shell_call_output names its call by the call's item id)."""
    arguments = call["function"]["arguments"]
    item_id = arguments.get("id") if isinstance(arguments, dict) else None
    return [call["id"], *([item_id] if isinstance(item_id, str) else [])]


def canonical_content(content: Any, path: str) -> Any:
    """Message or output content in the engine's parts (a string stays a string); BadField at
    `path` when it is neither text nor typed parts, or a text part holds no text."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise BadField(path, "a string or an array of typed objects", content)
    parts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in _TEXT_PARTS and isinstance(part.get("text"), str):
            parts.append(_text(part["text"]))
        elif isinstance(kind, str) and kind not in _TEXT_PARTS:
            parts.append(canonical_part(part))
        elif kind in _TEXT_PARTS:
            raise BadField(f"{path}[{j}].text", "a string", part.get("text"))
        else:
            raise BadField(path, "a string or an array of typed objects", content)
    return parts


def canonical_part(part: dict[str, Any]) -> dict[str, Any]:
    """A content part other than text as chat names it, so that the counter's estimates
    apply."""
    kind = part["type"]
    if kind == "input_image":
        url = part.get("image_url")
        image = {"url": url if isinstance(url, str) else ""}
        if "detail" in part:
            image["detail"] = part["detail"]
        return {"type": "image_url", "image_url": image}
    if kind == "input_file":
        data = part.get("file_data")
        return {"type": "file", "file": {"file_data": data} if isinstance(data, str) else {}}
    return part  # refusal and parts nobody knows: counted as they are


def output_content(output: Any, kind: str) -> tuple[Any, list[dict[str, Any]]]:
    """A tool message's content for `output`, and the cost to carry elsewhere when the output
    cannot be edited (a screenshot, a structured result): its tool message then shows a
    marker, which no layer makes smaller."""
    if is_editable(output):
        return canonical_content(output, ".output"), []
    if isinstance(output, dict) and output.get("type") == "computer_screenshot":
        image = {"type": "image_url", "image_url": {"url": output.get("image_url") or ""}}
        cost = [opaque(media_tokens(image))]
    else:
        cost = [{"type": "item", "item": output}]
    return f"[{kind}]", cost


def is_editable(output: Any) -> bool:
    """Whether a layer's edit of an output can be written back: text, or content parts."""
    return isinstance(output, str) or all_typed_objects(output)


def _opaque_parts(item: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    """What an item no layer edits costs: the opaque constant for what nobody can read, and
    its JSON for the rest."""
    if kind == "item_reference":
        return [opaque()]
    if kind == "reasoning":
        readable = [
            *_list(item.get("summary"), ".summary"),
            *_list(item.get("content"), ".content"),
        ]
        return [opaque(), *([{"type": "item", "item": readable}] if readable else [])]
    hidden = [f for f, where in _OPAQUE_FIELDS.items() if f in item and where in ("*", kind)]
    rest = {k: v for k, v in item.items() if k not in hidden}
    return [{"type": "item", "item": rest}, *([opaque()] if hidden else [])]


def _list(value: Any, path: str) -> list[Any]:
    if value is not None and not isinstance(value, list):
        raise BadField(path, "an array of objects", value)
    return value or []


def _copied(content: Any) -> Any:
    return list(content) if isinstance(content, list) else content


def _text(text: Any) -> dict[str, Any]:
    return {"type": "text", "text": text}
