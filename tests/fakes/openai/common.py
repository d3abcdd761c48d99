"""What both dialects of the fake share: token counting, errors, summaries, behaviours."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
from collections.abc import Iterable, Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

import orjson
import tiktoken

from tests.fakes.base import Behaviors

_litellm = importlib.util.find_spec("litellm")  # its tokenizer files make tiktoken work offline
if _litellm is not None and _litellm.submodule_search_locations:
    _tokenizers = Path(_litellm.submodule_search_locations[0], "litellm_core_utils", "tokenizers")
    os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(_tokenizers))

SUMMARY_HEADER = "x-compaction-summary"
SUMMARY_PROMPT_PREFIX = "You are compacting a conversation"
IMAGE_TOKENS = 85  # what OpenAI charges for a low-detail image

_O200K_MODELS = re.compile(r"gpt-4o|gpt-4\.1|gpt-5|chatgpt-4o|o\d")
BEHAVIORS: Behaviors = dict.fromkeys(("hang", "tool-call", "gzip", "redirect"), str) | {
    "slow-stream": float,
    "reset-mid-stream": int,
    "status": int,
}
_SAMPLE_ARGUMENTS: dict[Any, Any] = {"integer": 1, "number": 1, "boolean": True, "array": []}
_TEXT_PARTS = ("text", "input_text", "output_text", "summary_text", "reasoning_text")
METADATA_OBJECT = "a metadata object"  # what the API's type error says it expects (recorded)
SERVER_ERROR = "The server had an error while processing your request. Sorry about that!"
PARSE_ERROR = (
    "We could not parse the JSON body of your request. (HINT: This likely means you aren't using"
    " your HTTP library correctly. The OpenAI API expects a JSON payload, but what was sent was"
    " not valid JSON. If you have trouble figuring out how to fix this, please contact us through"
    " our help center at help.openai.com.)"
)


class ApiError(Exception):
    """An error answered with OpenAI's body ``{"error": {message, type, param, code}}``."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        kind: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.status = status
        self.body = {"error": {"message": message, "type": kind, "param": param, "code": code}}


# -- tokens ---------------------------------------------------------------------------------------


def encoding_name(model: str) -> str:
    return "o200k_base" if _O200K_MODELS.match(model) else "cl100k_base"


@lru_cache(maxsize=16384)  # histories are resent every turn: count each text once
def count_text(text: str, encoding: str) -> int:
    return len(tiktoken.get_encoding(encoding).encode(text, disallowed_special=()))


def count_json(value: Any, encoding: str) -> int:
    return count_text(orjson.dumps(value).decode(), encoding)


def content_tokens(content: Any, encoding: str) -> int:
    """A string, or parts of either API: text counted as text, an image as IMAGE_TOKENS, any other
    part (a file, audio) as its compact JSON."""
    if isinstance(content, str):
        return count_text(content, encoding)
    total = 0
    for part in content if isinstance(content, list) else ():
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in _TEXT_PARTS:
            total += count_text(str(part.get("text", "")), encoding)
        elif kind == "refusal":
            total += count_text(str(part.get("refusal", "")), encoding)
        elif kind in ("image_url", "input_image"):
            total += IMAGE_TOKENS
        else:
            total += count_json(part, encoding)
    return total


def cut_text(text: str, encoding: str, limit: int | None) -> tuple[str, int, bool]:
    """(text, its tokens, whether it was cut): cut at `limit` tokens, as the model would be."""
    tokens = tiktoken.get_encoding(encoding).encode(text, disallowed_special=())
    if limit is not None and len(tokens) > limit:
        return tiktoken.get_encoding(encoding).decode(tokens[: max(limit, 0)]), max(limit, 0), True
    return text, len(tokens), False


# -- errors ---------------------------------------------------------------------------------------


def bad(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param, code)


def invalid_type(param: str, expected: str, value: Any) -> ApiError:
    names = {
        str: "a string",
        bool: "a boolean",
        int: "an integer",
        float: "a decimal",
        dict: "an object",
        list: "an array",
        type(None): "null",
    }
    got = names.get(type(value), "a value")
    message = f"Invalid type for '{param}': expected {expected}, but got {got} instead."
    return bad(message, param, "invalid_type")


def check_flags(body: Mapping[str, Any], names: Iterable[str]) -> None:
    """Boolean fields: true, false or null, never a truthy string."""
    for name in names:
        if body.get(name) is not None and not isinstance(body[name], bool):
            raise invalid_type(name, "a boolean", body[name])


def check_limit(body: Mapping[str, Any], name: str, minimum: int) -> None:
    """An integer field of at least `minimum`, or null."""
    limit = body.get(name)
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool)):
        raise invalid_type(name, "an integer", limit)
    if limit is not None and limit < minimum:
        raise bad(
            f"Invalid '{name}': integer below minimum value. Expected a value >= {minimum},"
            f" but got {limit} instead.",
            name,
            "integer_below_min_value",
        )


def missing(param: str) -> ApiError:
    return bad(f"Missing required parameter: '{param}'.", param, "missing_required_parameter")


def invalid_value(value: Any, supported: Iterable[str], param: str) -> ApiError:
    names = [f"'{s}'" for s in supported]
    listed = names[0] if len(names) == 1 else f"{names[0]} and {names[1]}"
    if len(names) > 2:
        listed = ", ".join(names[:-1]) + f", and {names[-1]}"
    message = f"Invalid value: '{value}'. Supported values are: {listed}."
    return bad(message, param, "invalid_value")


# -- answers --------------------------------------------------------------------------------------


def text_of(content: Any) -> str:
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return content if isinstance(content, str) else ""


def digest(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=4).hexdigest()


def reply_text(prompt_tokens: int, last_user: str) -> str:
    """The fake's answer to an ordinary request, of either API."""
    return f"Fake reply to {digest(last_user)}: {prompt_tokens} prompt tokens."


def _input_items(body: Mapping[str, Any]) -> list[Any]:
    given = body.get("input")
    return given if isinstance(given, list) else [] if given is None else [given]


def is_summary_request(headers: Mapping[str, str], body: Mapping[str, Any]) -> bool:
    """The summary header, or a system prompt (a system or developer message, or the Responses
    API's `instructions`) starting with SUMMARY_PROMPT_PREFIX."""
    if headers.get(SUMMARY_HEADER) == "1":
        return True
    if "messages" in body:
        messages = body["messages"]
    else:
        instructions = body.get("instructions")
        if isinstance(instructions, str) and instructions.startswith(SUMMARY_PROMPT_PREFIX):
            return True
        messages = [i for i in _input_items(body) if isinstance(i, dict)]
    return any(
        m.get("role") in ("system", "developer")
        and text_of(m.get("content")).startswith(SUMMARY_PROMPT_PREFIX)
        for m in messages
    )


def sample_arguments(schema: Mapping[str, Any]) -> str:
    """Arguments for a function with this JSON schema: a sample value for each required field."""
    types = {k: (v or {}).get("type") for k, v in (schema.get("properties") or {}).items()}
    sample = {k: _SAMPLE_ARGUMENTS.get(types.get(k), "x") for k in schema.get("required", [])}
    return orjson.dumps(sample).decode()


def call_id(raw: bytes) -> str:
    """A tool call id, the same for the same request."""
    return "call_" + hashlib.blake2b(raw, digest_size=12).hexdigest()


# -- the wire -------------------------------------------------------------------------------------


def dumps(value: Any) -> str:
    return orjson.dumps(value).decode()
