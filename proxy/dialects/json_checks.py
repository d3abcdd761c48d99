"""Checks every dialect makes of a body before reading it: a JSON object with a model, nested
no deeper than the proxy can write back, its fields of the types compaction reads. Errors are
`InvalidRequest`s, which each dialect writes in its API's own shape."""

from __future__ import annotations

from typing import Any

import orjson

from proxy.errors import InvalidRequest, ProxyError

# How deeply a body may nest. The proxy writes parts of a body back out, some inside its own
# structures (stored plans), and orjson writes at most 254 levels: what passes here must too.
MAX_DEPTH = 100


def load_object(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object with a model, or a 400 saying why not. Every dialect
    reads its body here, so that what one accepts the proxy can always write back out."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(
            f"We could not parse the JSON body of your request: {exc.msg} at position {exc.pos}. "
            "The request body must be a JSON object.",
        ) from None
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object.")
    refuse_too_deep(body)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("you must provide a model parameter", param="model")
    return body


def refuse_too_deep(body: dict[str, Any]) -> None:
    """A 400 for a body nested deeper than MAX_DEPTH."""
    if not nests_within(body, MAX_DEPTH):
        raise InvalidRequest(
            f"The request body nests arrays and objects more than {MAX_DEPTH} levels deep, "
            "more than this proxy accepts."
        )


def nests_within(value: dict[str, Any] | list[Any], limit: int) -> bool:
    """Whether no array or object in `value` (itself level 1) is deeper than `limit`.

    Level by level, each a list of the arrays and objects at that depth; JSON decoders make
    exact dicts and lists, so a class is compared, not checked with isinstance (a third of
    the time of a walk with a stack of (node, depth) pairs, on a 900 KB body: 0.8 ms)."""
    level: list[Any] = [value]
    for _ in range(limit):
        deeper = []
        for node in level:
            for item in node.values() if node.__class__ is dict else node:
                if item.__class__ is dict or item.__class__ is list:
                    deeper.append(item)
        if not deeper:
            return True
        level = deeper
    return False


def optional_int(body: dict[str, Any], name: str) -> int | None:
    """An optional integer field of the body; a 400 when it is something else."""
    value = body.get(name)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise InvalidRequest(f"'{name}' must be an integer", param=name)
    return value


def optional_bool(body: dict[str, Any], name: str) -> bool:
    """An optional boolean field (absent or null: false); OpenAI's 400 for any other type,
    such as the string "false", which would read as true."""
    value = body.get(name)
    if value is not None and not isinstance(value, bool):
        raise invalid_type(name, "a boolean", value)
    return value is True


class BadField(ProxyError):
    """A field compaction reads has the wrong type: a signal inside the dialects, which turn
    it into `invalid_type` with the field's full location."""

    def __init__(self, path: str, expected: str, value: Any) -> None:
        self.path, self.expected, self.value = path, expected, value


def check_string(value: Any, path: str) -> None:
    """An optional string field."""
    if value is not None and not isinstance(value, str):
        raise BadField(path, "a string", value)


def all_typed_objects(content: Any) -> bool:
    return isinstance(content, list) and all(
        isinstance(part, dict) and isinstance(part.get("type"), str) for part in content
    )


_KINDS = {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}


def invalid_type(param: str, expected: str, value: Any) -> InvalidRequest:
    """A 400 for a field of the wrong type (the wording is OpenAI's)."""
    got = "null" if value is None else _KINDS.get(type(value), "a number")
    return InvalidRequest(
        f"Invalid type for '{param}': expected {expected}, but got {got} instead.",
        param=param,
        code="invalid_type",
    )


def error_field(payload: bytes, name: str) -> str | None:
    """A string field of the `error` object of an error body (OpenAI's and Anthropic's)."""
    try:
        error = orjson.loads(payload).get("error")
    except (orjson.JSONDecodeError, AttributeError):
        return None
    value = error.get(name) if isinstance(error, dict) else None
    return value if isinstance(value, str) else None
