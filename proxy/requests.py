"""Reading and checking what the client sent, before anything else is done with it."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.requests import Request

from .errors import BodyTooLarge, InvalidRequest


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refused with 413 as soon as it is known to exceed `limit`."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(_too_large(limit))
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(_too_large(limit))
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large(limit: int) -> str:
    return f"request body is larger than this proxy accepts ({limit} bytes)"


def parse_chat(raw: bytes) -> dict[str, Any]:
    """The chat completion body as a dict, checked just enough for the proxy to work on it.

    Everything else is the upstream's to judge, so its own error text reaches the client.
    """
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
            # The location is only spelled out when something is wrong: this loop runs over
            # every message of every request.
            raise _invalid_type(f"messages[{i}]{bad.path}", bad.expected, bad.value) from None
    for name in ("max_tokens", "max_completion_tokens"):
        value = body.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise InvalidRequest(f"'{name}' must be an integer", param=name)
    return body


class _BadField(Exception):
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


def query_string(request: Request) -> str:
    """The raw query string (without building a URL object on the hot path)."""
    query: bytes = request.scope.get("query_string", b"")
    return query.decode("latin-1")


def max_output_requested(body: dict[str, Any]) -> int | None:
    value = body.get("max_completion_tokens")
    if value is None:
        value = body.get("max_tokens")
    return value if isinstance(value, int) else None


def wants_usage(body: dict[str, Any]) -> bool:
    """Whether the client itself asked for usage (never add a chunk it did not request)."""
    if not body.get("stream"):
        return True
    options = body.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True
