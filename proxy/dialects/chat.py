"""Chat completions (`POST /v1/chat/completions`): the engine's own canonical form.

Each message is one native item, so a view maps back one to one; only the fields compaction
reads are checked (everything else is the upstream's to judge, in its own words).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from policies import Message

from ..errors import APIError, InvalidRequest, ProxyError, SummaryFailed
from ..tokens import TokenCounter
from .base import Dialect, Parsed, Usage


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


def load_object(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object, or OpenAI's 400 saying why not."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(
            f"We could not parse the JSON body of your request: {exc.msg} at position {exc.pos}. "
            "The request body must be a JSON object.",
        ) from None
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object.")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("you must provide a model parameter", param="model")
    return body


class Chat(Dialect):
    name = "chat"
    path = "/v1/chat/completions"
    upstream_path = "/chat/completions"

    def parse(self, raw: bytes) -> Parsed:
        body = load_object(raw)
        messages = body.get("messages")
        if not isinstance(messages, list):
            raise InvalidRequest("'messages' must be a list of message objects", param="messages")
        for i, message in enumerate(messages):
            if not isinstance(message, dict) or not isinstance(message.get("role"), str):
                raise InvalidRequest(
                    f"messages[{i}] must be an object with a string 'role'", param=f"messages[{i}]"
                )
            try:
                _check_message(message)
            except _BadField as bad:
                # The location is only spelled out when something is wrong: this loop runs
                # over every message of every request.
                raise _invalid_type(f"messages[{i}]{bad.path}", bad.expected, bad.value) from None
        for name in ("max_tokens", "max_completion_tokens"):
            value = body.get(name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise InvalidRequest(f"'{name}' must be an integer", param=name)
        max_output = body.get("max_completion_tokens")
        if max_output is None:
            max_output = body.get("max_tokens")
        return Parsed(
            raw=raw,
            body=body,
            model=body["model"],
            messages=messages,
            items=messages,
            spans=None,
            stream=bool(body.get("stream")),
            max_output=max_output,
        )

    def error_body(self, error: APIError) -> bytes:
        return openai_error_body(error)

    def session_hint(self, headers: Mapping[str, str], parsed: Parsed) -> str | None:
        metadata = parsed.body.get("metadata")
        value = metadata.get("session_id") if isinstance(metadata, dict) else None
        return value if isinstance(value, str) and value else None

    def fixed_tokens(self, parsed: Parsed, counter: TokenCounter) -> int:
        return counter.fixed(parsed.body)

    def summary_items(self, header: Message) -> list[Any]:
        return [header]

    def edited_items(self, items: Sequence[Any], original: Message, edited: Message) -> list[Any]:
        return [edited]

    def body_with(self, parsed: Parsed, items: list[Any]) -> bytes:
        return orjson.dumps({**parsed.body, "messages": items})

    def wants_usage(self, parsed: Parsed) -> bool:
        if not parsed.stream:
            return True
        options = parsed.body.get("stream_options")
        return isinstance(options, dict) and options.get("include_usage") is True

    def usage(self, payload: bytes) -> Usage | None:
        try:
            body = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return None
        return _usage(body.get("usage") if isinstance(body, dict) else None)

    def stream_usage(self, tail: bytes) -> Usage | None:
        for line in reversed(tail.split(b"\n")):
            if line.startswith(b"data:") and b'"usage"' in line:
                try:
                    event = orjson.loads(line[5:].strip())
                except orjson.JSONDecodeError:
                    continue
                usage = _usage(event.get("usage") if isinstance(event, dict) else None)
                if usage is not None:
                    return usage
        return None

    def is_overflow(self, status: int, payload: bytes) -> bool:
        return status == 400 and openai_error_code(payload) == "context_length_exceeded"

    def summary_body(
        self, model: str, system: str, prompt: str, max_tokens: int, temperature: float
    ) -> bytes:
        body: dict[str, Any] = {
            "model": model,
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": prompt},
            ],
        }
        if is_reasoning_model(model):
            # Reasoning models reject temperature, and spend output tokens on reasoning first.
            body["max_completion_tokens"] = max_tokens + REASONING_HEADROOM_TOKENS
            body["reasoning_effort"] = "low"
        else:
            body["temperature"] = temperature
            body["max_tokens"] = max_tokens
        return orjson.dumps(body)

    def summary_text(self, payload: bytes) -> str:
        choice = orjson.loads(payload)["choices"][0]
        if choice.get("finish_reason") == "length":
            raise SummaryFailed("overlong")
        content = choice["message"].get("content")
        return content if isinstance(content, str) else ""


REASONING_HEADROOM_TOKENS = 2048  # output room for a reasoning model's reasoning


def is_reasoning_model(model: str) -> bool:
    """OpenAI's reasoning models (o-series, gpt-5 family), provider prefixes ignored."""
    name = model.rsplit("/", 1)[-1].lower()
    return name.startswith(("o1", "o3", "o4", "gpt-5"))


def openai_error_code(payload: bytes) -> str | None:
    """The `error.code` of an OpenAI error body, if it is one."""
    try:
        error = orjson.loads(payload).get("error")
    except (orjson.JSONDecodeError, AttributeError):
        return None
    code = error.get("code") if isinstance(error, dict) else None
    return code if isinstance(code, str) else None


def _usage(usage: Any) -> Usage | None:
    if not isinstance(usage, dict):
        return None
    prompt = usage.get("prompt_tokens")
    if not isinstance(prompt, int) or isinstance(prompt, bool):
        return None
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return Usage(prompt, cached if isinstance(cached, int) else None)


class _BadField(ProxyError):  # a signal inside this module, caught by `parse`
    def __init__(self, path: str, expected: str, value: Any) -> None:
        self.path, self.expected, self.value = path, expected, value


def _check_message(message: dict[str, Any]) -> None:
    """The fields compaction reads have the types OpenAI requires of them.

    OpenAI refuses these requests too; checking here keeps a malformed message that would
    need compacting from reaching the compaction layers, which assume OpenAI's shapes.
    """
    content = message.get("content")
    if not (content is None or isinstance(content, str) or _all_typed_objects(content)):
        raise _BadField(".content", "a string or an array of typed objects", content)
    for name in ("tool_call_id", "name"):
        _check_string(message.get(name), f".{name}")
    calls = message.get("tool_calls")
    if calls is None:
        return
    if not isinstance(calls, list):
        raise _BadField(".tool_calls", "an array of objects", calls)
    for j, call in enumerate(calls):
        if not isinstance(call, dict):
            raise _BadField(f".tool_calls[{j}]", "an object", call)
        _check_string(call.get("id"), f".tool_calls[{j}].id")
        function = call.get("function")
        if function is None:
            continue
        if not isinstance(function, dict):
            raise _BadField(f".tool_calls[{j}].function", "an object", function)
        for name in ("name", "arguments"):
            _check_string(function.get(name), f".tool_calls[{j}].function.{name}")


def _all_typed_objects(content: Any) -> bool:
    return isinstance(content, list) and all(
        isinstance(part, dict) and isinstance(part.get("type"), str) for part in content
    )


def _check_string(value: Any, path: str) -> None:
    if value is not None and not isinstance(value, str):
        raise _BadField(path, "a string", value)


_KINDS = {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}


def _invalid_type(param: str, expected: str, value: Any) -> InvalidRequest:
    got = "null" if value is None else _KINDS.get(type(value), "a number")
    return InvalidRequest(
        f"Invalid type for '{param}': expected {expected}, but got {got} instead.",
        param=param,
        code="invalid_type",
    )
