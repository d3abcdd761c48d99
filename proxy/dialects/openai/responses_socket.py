"""The Responses API over a WebSocket, as Codex CLI's built-in provider speaks it (codex-rs
`codex-api/src/endpoint/responses_websocket.rs`, `core/src/client.rs`): a client's frames, the
history a connection keeps, and the events of an answer.

A client sends one `{"type": "response.create", ...}` text frame a request, with the fields of
a `POST /v1/responses` body, and gets the events of its answer, the same JSON as the SSE
stream's `data:`, one a text frame. A request may continue the connection's last response
(`previous_response_id`) with only the items that follow it: its history is then that
response's input, its output items and these. With `store: false` no one holds that history
but the connection, so the proxy keeps it (`Chain`), up to a bound; a continuation it cannot
rebuild is answered `previous_response_not_found`, on which Codex reconnects and sends the
whole input. An error is an `error` event with the HTTP status it stands for: Codex ignores
one without a status and waits until its idle timeout.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

import orjson

from proxy.dialects.json_checks import invalid_type, load_object
from proxy.dialects.openai import responses_answers as answers
from proxy.dialects.openai.responses import input_items
from proxy.errors import InvalidRequest, PreviousResponseNotFound

CREATE = "response.create"
# A frame's fields that a POST body has not: its type, the warm-up switch and the response it
# continues (the proxy rebuilds that history into `input`).
_OF_THE_SOCKET = frozenset({"type", "generate", "previous_response_id", "input"})
# The events that end an answer: those that close a response the next request may continue,
# then those that fail it.
_CONTINUABLE = frozenset({b"response.completed", b"response.incomplete"})
_ENDING = _CONTINUABLE | {b"response.failed", b"error"}
_ITEM_DONE = b"response.output_item.done"
# The events parsed as they are relayed: a type's quotes never occur unescaped inside a string.
_MARKERS = tuple(b'"' + kind + b'"' for kind in (*_ENDING, _ITEM_DONE))


@dataclasses.dataclass(frozen=True)
class Create:
    """A `response.create` frame."""

    fields: dict[str, Any]  # those of a POST body, `input` aside
    items: bytes  # the input items given, as a JSON array
    previous: str | None  # the response it continues
    generate: bool  # false: a warm-up, answered without inference


def read_create(frame: str) -> Create:
    """A client's frame, or a 400 saying what is wrong with it."""
    body = load_object(frame.encode())
    kind = body.get("type")
    if kind != CREATE:
        raise InvalidRequest(
            f"Unsupported event type {str(kind)[:40]!r}: this proxy takes {CREATE!r} events.",
            param="type",
        )
    previous = body.get("previous_response_id")
    if not isinstance(previous, str | None):
        raise invalid_type("previous_response_id", "a string", previous)
    generate = body.get("generate", True)
    if not isinstance(generate, bool):
        raise invalid_type("generate", "a boolean", generate)
    items = orjson.dumps(input_items(body.get("input")))
    fields = {k: v for k, v in body.items() if k not in _OF_THE_SOCKET}
    return Create(fields, items, previous or None, generate)


class Chain:
    """A connection's last response that a request may continue: its id, and the whole
    history up to it (the input it answered, then its output items) as JSON, kept byte for
    byte so that each request sends it as the one before did. A history over `limit` bytes
    is not kept."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._id: str | None = None
        self._items = b"[]"

    def input(self, create: Create) -> bytes:
        """The whole input of `create`, as a JSON array: the history it continues, then the
        items it gives."""
        if create.previous is None:
            return create.items
        if create.previous != self._id:
            raise PreviousResponseNotFound(
                f"Previous response with id {create.previous[:80]!r} not found: this proxy"
                f" keeps a connection's last response only, and only up to {self.limit} bytes"
                " of history. Send the whole input.",
                param="previous_response_id",
            )
        return _joined(self._items, create.items)

    def keep(self, given: bytes, answer: Answer) -> bool:
        """Keep the response of `answer` to the input `given` when a later request may
        continue it; false when its history is over the limit (and nothing is kept)."""
        if answer.response_id is None or answer.ended not in _CONTINUABLE:
            return True
        items = _joined(given, answer.output)
        kept = len(items) <= self.limit
        self._id, self._items = (answer.response_id, items) if kept else (None, b"[]")
        return kept


def request_body(create: Create, given: bytes) -> bytes:
    """`create` as the body of a `POST /v1/responses` with the input `given` (a JSON array),
    streamed: over a WebSocket every answer is a stream of events."""
    return orjson.dumps({**create.fields, "stream": True, "input": orjson.Fragment(given)})


def warm_up(create: Create) -> bytes:
    """The answer to a warm-up (`generate: false`) as the SSE events of a completed response
    with no output and no tokens."""
    return answers.events(answers.completed(create.fields, [], answers.usage(0, 0)))


class Answer:
    """An answer's events as they go to the client: the response's id and output items, and
    how it ended."""

    def __init__(self) -> None:
        self.response_id: str | None = None
        self.ended: bytes | None = None  # the type of the event that ended it
        self._output: dict[int, bytes] = {}

    def saw(self, event: bytes) -> None:
        if not any(marker in event for marker in _MARKERS):
            return
        try:
            read = orjson.loads(event)
        except orjson.JSONDecodeError:
            return  # the client gets it as it came, and no history is made of it
        kind = str(read.get("type")).encode() if isinstance(read, dict) else b""
        if kind == _ITEM_DONE and isinstance(index := read.get("output_index"), int):
            self._output[index] = orjson.dumps(read.get("item"))
        elif kind in _ENDING:
            self.ended = kind
            response = read.get("response")
            if isinstance(response, dict) and isinstance(response.get("id"), str):
                self.response_id = response["id"]

    @property
    def output(self) -> bytes:
        """The response's output items as a JSON array, in their order."""
        return b"[" + b",".join(item for _, item in sorted(self._output.items())) + b"]"


def error_event(status: int, body: bytes, headers: Iterable[tuple[str, str]] = ()) -> str:
    """An HTTP error answer as the `error` event a WebSocket client reads: its status, the
    error object of its body (OpenAI's shape; else its text) and its headers."""
    try:
        read = orjson.loads(body)
    except orjson.JSONDecodeError:
        read = None
    error = read.get("error") if isinstance(read, dict) else None
    if not isinstance(error, dict):
        text = body[:2000].decode("utf-8", "replace")
        error = {"type": "upstream_error", "message": text or f"HTTP {status}"}
    event: dict[str, Any] = {"type": "error", "status": status, "error": error}
    if shown := dict(headers):
        event["headers"] = shown
    return orjson.dumps(event).decode()


def _joined(first: bytes, then: bytes) -> bytes:
    """Two JSON arrays as one."""
    if first == b"[]":
        return then
    if then == b"[]":
        return first
    return first[:-1] + b"," + then[1:]
