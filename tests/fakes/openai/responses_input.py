"""Responses API input: the request's checks, the fake's memory, and prompt token counting.

See ``responses.py`` for the facts about the real API these rules reproduce.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import orjson

from tests.fakes.openai.common import (
    METADATA_OBJECT,
    PARSE_ERROR,
    ApiError,
    bad,
    check_flags,
    check_limit,
    content_tokens,
    count_json,
    count_text,
    encoding_name,
    invalid_type,
    invalid_value,
    missing,
)

REASONING_MODELS = re.compile(r"o\d|gpt-5|codex")
ENCRYPTED_TOKENS = 32  # what a reasoning or compaction item's encrypted content counts
CACHE_MIN_TOKENS, CACHE_STEP = 1024, 128


def _names(text: str) -> list[str]:
    return text.split()


PARAMS = frozenset(
    _names("""model input instructions tools tool_choice include max_output_tokens store stream
    stream_options prompt_cache_key reasoning text metadata parallel_tool_calls temperature top_p
    truncation user service_tier previous_response_id conversation safety_identifier prompt
    background max_tool_calls top_logprobs""")
    # also in openai-python's ResponseCreateParams (accepted, then ignored):
    + _names("""context_management prompt_cache_retention prompt_cache_options background_options
    access_programs moderation image""")
    # also sent by Codex CLI 0.171 to every provider, its own host's included
    + _names("client_metadata")
)
COMPACT_PARAMS = frozenset(
    _names("""model input instructions previous_response_id prompt_cache_key prompt_cache_options
    prompt_cache_retention service_tier image""")
    # also sent by Codex CLI, as in its /v1/responses requests (codex-rs, compact_remote.rs)
    + _names("tools parallel_tool_calls reasoning text")
)
# The items of provider compaction, which a server without it (a local one) does not know.
PROVIDER_COMPACTION_ITEMS = ("compaction", "compaction_trigger")
INCLUDABLE = (
    "file_search_call.results",
    "web_search_call.results",
    "web_search_call.action.sources",
    "message.input_image.image_url",
    "computer_call_output.output.image_url",
    "code_interpreter_call.outputs",
    "reasoning.encrypted_content",
    "message.output_text.logprobs",
)
ROLES = ("user", "assistant", "system", "developer")
_INPUT_PARTS = ("input_text", "input_image", "input_file")  # user, system, developer messages
_OUTPUT_PARTS = ("output_text", "refusal")  # assistant messages
CALLS = {  # the calls a client answers, and how errors name them
    "function_call": "function call",
    "custom_tool_call": "custom tool call",
    "local_shell_call": "local shell call",
    "computer_call": "computer call",
    "shell_call": "shell call",
    "apply_patch_call": "apply patch call",
}
OUTPUTS = {  # each output type, and the calls it may answer
    "function_call_output": ("function_call", "local_shell_call"),
    "custom_tool_call_output": ("custom_tool_call",),
    "local_shell_call_output": ("local_shell_call",),
    "computer_call_output": ("computer_call",),
    "shell_call_output": ("shell_call",),
    "apply_patch_call_output": ("apply_patch_call",),
}
_REQUIRED = {
    "message": ("role", "content"),
    "function_call": ("call_id", "name", "arguments"),
    "function_call_output": ("call_id", "output"),
    "custom_tool_call": ("call_id", "name", "input"),
    "custom_tool_call_output": ("call_id", "output"),
    "local_shell_call": ("call_id", "action"),
    "local_shell_call_output": ("id", "output"),
    "computer_call": ("id", "call_id"),
    "computer_call_output": ("call_id", "output"),
    "shell_call": ("call_id", "action"),
    "shell_call_output": ("call_id", "output"),
    "apply_patch_call": ("call_id", "operation", "status"),
    "apply_patch_call_output": ("call_id", "status"),
    "web_search_call": ("id", "status"),
    "file_search_call": ("id", "queries", "status"),
    "reasoning": ("summary",),
    "compaction": ("encrypted_content",),
    "item_reference": ("id",),
}
_OTHER_ITEMS = _names("""image_generation_call code_interpreter_call mcp_list_tools
    mcp_approval_request mcp_approval_response mcp_call tool_search_call tool_search_output
    additional_tools configuration_update compaction_trigger program program_output""")
ITEM_TYPES = tuple(sorted({*_REQUIRED, *CALLS, *OUTPUTS, *_OTHER_ITEMS}))


def new_id(prefix: str) -> str:
    return f"{prefix}_{os.urandom(24).hex()}"


def put(table: OrderedDict[str, Any], key: str, value: Any, limit: int = 4096) -> None:
    table[key] = value
    table.move_to_end(key)
    while len(table) > limit:
        table.popitem(last=False)


class Memory:
    """What one fake remembers between Responses requests (bounded, oldest forgotten first)."""

    def __init__(self, secret: bytes | None = None) -> None:
        # encrypted content is only valid for the fake that made it (or one given its secret)
        self.secret = secret or os.urandom(16)
        self.responses: OrderedDict[str, list[dict[str, Any]]] = OrderedDict()  # id -> context
        self.items: OrderedDict[str, dict[str, Any]] = OrderedDict()  # stored output items by id
        self.follows: OrderedDict[str, str] = OrderedDict()  # item id -> reasoning id before it
        self.cache: OrderedDict[str, tuple[str, list[tuple[bytes, int]]]] = OrderedDict()

    def seal(self, kind: str, item_id: str) -> str:
        """Encrypted content for an item: opaque, and only this fake can verify it."""
        payload = orjson.dumps({"kind": kind, "id": item_id, "nonce": os.urandom(6).hex()})
        mac = hmac.new(self.secret, payload, hashlib.sha256).digest()[:16]
        return "gAAAAA" + base64.urlsafe_b64encode(mac + payload).decode()

    def unseal(self, blob: Any) -> dict[str, Any] | None:
        """What seal() sealed, or None when this fake did not make `blob`."""
        if not isinstance(blob, str) or not blob.startswith("gAAAAA"):
            return None
        try:
            raw = base64.urlsafe_b64decode(blob[6:])
        except ValueError:
            return None
        mac, payload = raw[:16], raw[16:]
        expected = hmac.new(self.secret, payload, hashlib.sha256).digest()[:16]
        if not hmac.compare_digest(mac, expected):
            return None
        sealed: dict[str, Any] = orjson.loads(payload)
        return sealed

    def cached_tokens(self, model: str, key: str, units: list[tuple[bytes, int]]) -> int:
        """Tokens of the prefix shared with the last request under `key`; remembers this one."""
        previous = self.cache.get(key)
        common = 0
        if previous is not None and previous[0] == model:
            for (mark, tokens), (seen, _) in zip(units, previous[1], strict=False):
                if mark != seen:
                    break
                common += tokens
        put(self.cache, key, (model, units), limit=1024)
        cached = common // CACHE_STEP * CACHE_STEP
        return cached if cached >= CACHE_MIN_TOKENS else 0


# -- validation -----------------------------------------------------------------------------------


def item_type(item: Mapping[str, Any]) -> str:
    """An item's type; without one, a message when it has a role, else an item reference."""
    kind = item.get("type")
    if kind is None:
        return "message" if "role" in item else "item_reference" if "id" in item else ""
    return str(kind)


def _check_unknown(body: Mapping[str, Any], allowed: frozenset[str]) -> None:
    for key in body:
        if key not in allowed:
            raise bad(f"Unknown parameter: '{key}'.", key, "unknown_parameter")


def _check_message(where: str, item: Mapping[str, Any]) -> None:
    role = item["role"]
    if role not in ROLES:
        raise invalid_value(role, ROLES, f"{where}.role")
    content = item["content"]
    if not isinstance(content, str | list):
        raise invalid_type(f"{where}.content", "one of a string or array of objects", content)
    allowed = _OUTPUT_PARTS if role == "assistant" else _INPUT_PARTS
    for index, part in enumerate(content if isinstance(content, list) else ()):
        at = f"{where}.content[{index}]"
        if not isinstance(part, dict):
            raise invalid_type(at, "an object", part)
        kind = part.get("type")
        if kind not in allowed:
            raise invalid_value(kind, allowed, at)
        field = {"input_text": "text", "output_text": "text", "refusal": "refusal"}.get(str(kind))
        if field and not isinstance(part.get(field), str):
            raise missing(f"{at}.{field}")
        if kind == "input_image" and not (part.get("image_url") or part.get("file_id")):
            raise missing(f"{at}.image_url")


def _check_item(index: int, item: Any) -> None:
    where = f"input[{index}]"
    if not isinstance(item, dict):
        raise invalid_type(where, "an object", item)
    kind = item_type(item)
    if kind not in ITEM_TYPES:
        raise invalid_value(kind, ITEM_TYPES, where)
    for field in _REQUIRED.get(kind, ()):
        if item.get(field) is None:
            raise missing(f"{where}.{field}")
    for field in ("id", "call_id", "name", "arguments", "encrypted_content"):
        if field in item and item[field] is not None and not isinstance(item[field], str):
            raise invalid_type(f"{where}.{field}", "a string", item[field])
    if kind == "message":
        _check_message(where, item)
    elif kind in ("function_call_output", "custom_tool_call_output"):
        if not isinstance(item["output"], str | list):
            expected = "one of a string or array of objects"
            raise invalid_type(f"{where}.output", expected, item["output"])
    elif kind == "reasoning":
        if not isinstance(item["summary"], list):
            raise invalid_type(f"{where}.summary", "an array of objects", item["summary"])
        if not item.get("id") and item.get("encrypted_content") is None:
            raise missing(f"{where}.id")


def _check_tools(body: Mapping[str, Any]) -> None:
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise invalid_type("tools", "an array", tools)
    names = set()
    for index, tool in enumerate(tools or []):
        if not isinstance(tool, dict):
            raise invalid_type(f"tools[{index}]", "an object", tool)
        if not tool.get("type"):
            raise missing(f"tools[{index}].type")
        if tool["type"] in ("function", "custom"):
            if not tool.get("name"):
                raise missing(f"tools[{index}].name")
            names.add(tool["name"])
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") in ("function", "custom"):
        if choice.get("name") not in names:
            message = f"Tool choice '{choice['type']}' not found in 'tools' parameter."
            raise bad(message, "tool_choice")
    elif not isinstance(choice, dict | None) and choice not in ("none", "auto", "required"):
        raise invalid_value(choice, ("none", "auto", "required"), "tool_choice")


def check_request(body: Any, allowed: frozenset[str]) -> None:
    if not isinstance(body, dict):
        raise bad(PARSE_ERROR)
    _check_unknown(body, allowed)
    if body.get("model") in (None, ""):
        raise missing("model")
    if not isinstance(body["model"], str):
        raise invalid_type("model", "a string", body["model"])
    if "instructions" in body and not isinstance(body["instructions"], str | None):
        raise invalid_type("instructions", "a string", body["instructions"])
    given = body.get("input")
    elsewhere = ("previous_response_id", "prompt", "conversation")
    if given is None and not any(body.get(k) for k in elsewhere):
        raise missing("input")
    if given is not None and not isinstance(given, str | list):
        raise invalid_type("input", "one of a string or array of input items", given)
    for index, item in enumerate(given if isinstance(given, list) else ()):
        _check_item(index, item)


def check_trigger(items: list[Any]) -> bool:
    """Whether the input ends with a compaction_trigger, which must be its final item."""
    kinds = [item_type(item) for item in items]
    for index, kind in enumerate(kinds[:-1]):
        if kind == "compaction_trigger":
            raise bad("A compaction_trigger item must be the final input item.", f"input[{index}]")
    return bool(kinds) and kinds[-1] == "compaction_trigger"


def refuse_provider_compaction(body: Mapping[str, Any]) -> None:
    """A server without provider compaction: its items are types it does not know."""
    given = body.get("input")
    supported = [kind for kind in ITEM_TYPES if kind not in PROVIDER_COMPACTION_ITEMS]
    for index, item in enumerate(given if isinstance(given, list) else ()):
        if item_type(item) in PROVIDER_COMPACTION_ITEMS:
            raise invalid_value(item_type(item), supported, f"input[{index}].type")


def validate_compact(body: Any) -> None:
    """Raise the ApiError the real API answers for a malformed compaction request (as far as
    can be told without the fake's memory)."""
    check_request(body, COMPACT_PARAMS)


def validate_responses(body: Any) -> None:
    """Raise the ApiError the real API answers for a malformed request, as far as it can be told
    without the fake's memory (stored items, encrypted content, reasoning items)."""
    check_request(body, PARAMS)
    _check_tools(body)
    check_flags(body, ("store", "stream", "background", "parallel_tool_calls"))
    for field in ("reasoning", "text", "metadata", "stream_options", "prompt"):
        if body.get(field) is not None and not isinstance(body[field], dict):
            expected = METADATA_OBJECT if field == "metadata" else "an object"
            raise invalid_type(field, expected, body[field])
    include = body.get("include")
    if include is not None and not isinstance(include, list):
        raise invalid_type("include", "an array of strings", include)
    for index, value in enumerate(include or []):
        if value not in INCLUDABLE:
            raise invalid_value(value, INCLUDABLE, f"include[{index}]")
    check_limit(body, "max_output_tokens", 16)
    if body.get("stream_options") is not None and not body.get("stream"):
        only = "The 'stream_options' parameter is only allowed when 'stream' is enabled."
        raise bad(only, "stream_options")
    if body.get("previous_response_id") and body.get("conversation"):
        raise bad(
            "Mutually exclusive parameters: Ensure you are only providing one of:"
            " 'previous_response_id' or 'conversation'.",
            None,
            "mutually_exclusive_parameters",
        )
    if REASONING_MODELS.match(body["model"]) and body.get("temperature") not in (None, 1):
        message = "Unsupported parameter: 'temperature' is not supported with this model."
        raise bad(message, "temperature")


def _not_found(item_id: str, store: bool) -> ApiError:
    message = f"Item with id '{item_id}' not found."
    if not store:
        message += (
            " Items are not persisted when `store` is set to false. Try again with `store` set to"
            " true, or remove this item from your input."
        )
    return ApiError(404, message, "input")


def _unverified(name: str, reason: str) -> ApiError:
    message = f"The encrypted content for item {name} could not be verified. Reason: {reason}"
    return bad(message, None, "invalid_encrypted_content")


def _resolve(memory: Memory, index: int, item: dict[str, Any], store: bool) -> dict[str, Any]:
    """The item the model sees: a reference looked up, encrypted content verified."""
    kind = item_type(item)
    if kind == "item_reference" or (kind == "reasoning" and item.get("encrypted_content") is None):
        found = memory.items.get(item["id"])
        if found is None or (kind == "reasoning" and found["type"] != "reasoning"):
            raise _not_found(item["id"], store)
        return found if kind == "item_reference" else item
    if kind in ("reasoning", "compaction"):
        sealed = memory.unseal(item["encrypted_content"])
        target = item.get("id")
        if sealed is None or sealed["kind"] != kind:
            name = target or f"input[{index}]"
            raise _unverified(name, "Encrypted content could not be decrypted or parsed.")
        if target and sealed["id"] != target:
            raise _unverified(target, "Encrypted content item_id did not match the target item id.")
    return item


def context(memory: Memory, body: Mapping[str, Any], store: bool) -> tuple[list[Any], int]:
    """(the stored chain of previous_response_id then this input, where this input starts)."""
    items: list[dict[str, Any]] = []
    previous = body.get("previous_response_id")
    if previous:
        stored = memory.responses.get(previous)
        if stored is None:
            message = f"Previous response with id '{previous}' not found."
            raise bad(message, "previous_response_id", "previous_response_not_found")
        items = list(stored)
    given = body.get("input")
    new = [{"role": "user", "content": given}] if isinstance(given, str) else list(given or [])
    return items + [_resolve(memory, i, item, store) for i, item in enumerate(new)], len(items)


def check_pairs(items: list[dict[str, Any]]) -> None:
    """Every output answers an earlier call; every call is answered before the next user turn."""
    calls: dict[str, str] = {}  # call_id (and id, for local shell calls) -> call type
    pending: list[str] = []
    answered: set[str] = set()
    for item in items:
        kind = item_type(item)
        if kind in CALLS:
            calls[item["call_id"]] = kind
            if kind == "local_shell_call" and item.get("id"):
                calls[item["id"]] = kind
            pending.append(item["call_id"])
        elif kind in OUTPUTS:
            key = str(item.get("call_id") or item.get("id"))
            if calls.get(key, "") not in OUTPUTS[kind]:
                what = kind.removesuffix("_output").replace("_", " ")
                raise bad(f"No tool call found for {what} output with call_id {key}.", "input")
            answered.add(key)
        elif kind == "message" and item.get("role") == "user":
            for key in pending:
                if key not in answered:
                    raise bad(f"No tool output found for {CALLS[calls[key]]} {key}.", "input")
            pending = []


def check_reasoning(memory: Memory, items: list[dict[str, Any]], new_from: int) -> None:
    """An item that followed a reasoning item in the fake's output comes after that item again."""
    given: set[str] = set()
    for index, item in enumerate(items):
        kind = item_type(item)
        if kind == "reasoning":
            sealed = memory.unseal(item.get("encrypted_content")) or {}
            given.update(filter(None, (item.get("id"), sealed.get("id"))))
            continue
        needed = memory.follows.get(item.get("id") or "")
        if index >= new_from and needed and needed not in given:
            raise bad(
                f"Item '{item['id']}' of type '{kind}' was provided without its required"
                f" 'reasoning' item: '{needed}'.",
                "input",
            )


# -- tokens ---------------------------------------------------------------------------------------


def item_tokens(item: Mapping[str, Any], encoding: str) -> int:
    kind = item_type(item)
    if kind == "message":
        role = count_text(str(item["role"]), encoding)
        return 3 + role + content_tokens(item["content"], encoding)
    if kind == "reasoning":
        texts = [*(item.get("summary") or []), *(item.get("content") or [])]
        return 3 + ENCRYPTED_TOKENS + content_tokens(texts, encoding)
    if kind == "compaction":
        return 3 + ENCRYPTED_TOKENS
    if kind in ("function_call", "custom_tool_call"):
        said = item["arguments"] if kind == "function_call" else item["input"]
        return 3 + count_text(str(item["name"]), encoding) + count_text(str(said), encoding)
    if kind in OUTPUTS and isinstance(item.get("output"), str | list):
        return 3 + content_tokens(item["output"], encoding)
    return 3 + count_json({k: v for k, v in item.items() if k not in ("id", "type")}, encoding)


def tools_tokens(tools: list[dict[str, Any]], encoding: str) -> int:
    """As chat counts them: 12, and 7 plus its JSON (a function's without type) for each tool."""
    if not tools:
        return 0
    bare = [
        {k: v for k, v in tool.items() if k != "type"} if tool["type"] == "function" else tool
        for tool in tools
    ]
    return 12 + sum(7 + count_json(tool, encoding) for tool in bare)


def prompt_units(body: Mapping[str, Any], items: list[dict[str, Any]]) -> list[tuple[bytes, int]]:
    """The prompt in cacheable order, (fingerprint, tokens) for the tools, instructions, items."""
    encoding = encoding_name(body["model"])
    tools = body.get("tools") or []

    def mark(value: Any) -> bytes:
        canonical = orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
        return hashlib.blake2b(canonical, digest_size=12).digest()

    units = [(mark(["tools", tools]), 3 + tools_tokens(tools, encoding))]
    instructions = body.get("instructions")
    if instructions:
        tokens = 3 + count_text("system", encoding) + count_text(instructions, encoding)
        units.append((mark(["instructions", instructions]), tokens))
    return units + [(mark(item), item_tokens(item, encoding)) for item in items]


def count_input_tokens(body: Mapping[str, Any]) -> int:
    """The input tokens of a valid request that refers to nothing stored (no
    previous_response_id, no item_reference)."""
    given = body.get("input")
    items = [{"role": "user", "content": given}] if isinstance(given, str) else given or []
    return sum(tokens for _, tokens in prompt_units(body, items))


def is_reasoning(body: Mapping[str, Any]) -> bool:
    reasoning = body.get("reasoning")
    if isinstance(reasoning, dict) and reasoning.get("effort") == "none":
        return False
    return bool(REASONING_MODELS.match(body["model"])) or reasoning is not None
