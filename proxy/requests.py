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
    for name in ("max_tokens", "max_completion_tokens"):
        value = body.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise InvalidRequest(f"'{name}' must be an integer", param=name)
    return body


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
