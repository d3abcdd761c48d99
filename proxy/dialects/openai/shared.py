"""What OpenAI's two APIs (chat completions and Responses) share: the error shape, the body
checks, usage, the overflow error, the output limit and which models reason."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import orjson

from proxy.dialects.base import Dialect, Usage
from proxy.dialects.json_checks import error_field
from proxy.errors import APIError

REASONING_HEADROOM_TOKENS = 2048  # output room for a reasoning model's reasoning


class OpenAIDialect(Dialect):
    """A dialect of OpenAI's: its errors, its context overflow and its usage are OpenAI's."""

    # Where usage holds the prompt tokens, and the details that hold the cached ones.
    usage_fields: ClassVar[tuple[str, str]]

    def error_body(self, error: APIError) -> bytes:
        return openai_error_body(error)

    def usage(self, payload: bytes) -> Usage | None:
        try:
            body = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return None
        return self.usage_of(body.get("usage") if isinstance(body, dict) else None)

    def usage_of(self, usage: Any) -> Usage | None:
        """The prompt tokens and the cached ones of a `usage` object."""
        if not isinstance(usage, dict):
            return None
        tokens, details = self.usage_fields
        prompt = usage.get(tokens)
        if not isinstance(prompt, int) or isinstance(prompt, bool):
            return None
        found = usage.get(details)
        cached = found.get("cached_tokens") if isinstance(found, dict) else None
        if not isinstance(cached, int) or isinstance(cached, bool):
            cached = None
        return Usage(prompt, cached)

    def is_overflow(self, status: int, payload: bytes) -> bool:
        return status == 400 and openai_error_code(payload) == "context_length_exceeded"


def with_output_limit(
    body: bytes, names: Sequence[str], max_output: int, least: int
) -> bytes | None:
    """`body` with the first of the output limits `names` it sets at `max_output`; None when
    it sets none (the upstream then leaves the output what the window does) or `max_output`
    is under the `least` the API takes."""
    request = orjson.loads(body)
    name = next((name for name in names if name in request), None)
    if name is None or max_output < least:
        return None
    return orjson.dumps({**request, name: max_output})


def openai_error_body(error: APIError) -> bytes:
    """OpenAI's error shape: `{"error": {"message", "type", "param", "code"}}`."""
    return orjson.dumps(
        {
            "error": {
                "message": error.message,
                "type": error.error_type,
                "param": error.param,
                "code": error.code,
            }
        }
    )


def is_reasoning_model(model: str) -> bool:
    """OpenAI's reasoning models (o-series, gpt-5 family, codex), provider prefixes ignored."""
    name = model.rsplit("/", 1)[-1].lower()
    return name.startswith(("o1", "o3", "o4", "gpt-5", "codex"))


def openai_error_code(payload: bytes) -> str | None:
    """The `error.code` of an OpenAI error body, if it is one."""
    return error_field(payload, "code")
