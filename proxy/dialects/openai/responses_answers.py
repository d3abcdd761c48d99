"""Answers of the Responses API that the proxy writes itself, as the API writes them: a
provider compaction it serves (`POST /v1/responses/compact`, or a `compaction_trigger` at the
end of a `POST /v1/responses` input), in JSON or, for a streamed response, as its SSE events;
and the answer to a WebSocket's warm-up (`generate: false`), which has no output.
"""

from __future__ import annotations

import os
import time
from typing import Any

import orjson

from proxy.dialects.openai.responses_items import item_type


def compaction_item(encrypted_content: str) -> dict[str, Any]:
    return {"id": _new_id("cmp"), "type": "compaction", "encrypted_content": encrypted_content}


def usage(input_tokens: int, output_tokens: int) -> dict[str, Any]:
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": input_tokens + output_tokens,
    }


def compacted(items: list[Any], item: dict[str, Any], used: dict[str, Any]) -> bytes:
    """The answer of `/v1/responses/compact` to a request of input `items`: their user
    messages kept, then the compaction `item`."""
    kept = [_user_message(given) for given in items]
    answer = {
        "id": _new_id("resp"),
        "object": "response.compaction",
        "created_at": int(time.time()),
        "output": [*filter(None, kept), item],
        "usage": used,
    }
    return orjson.dumps(answer)


def completed(
    body: dict[str, Any], output: list[dict[str, Any]], used: dict[str, Any]
) -> dict[str, Any]:
    """A completed response to the request `body` whose output items are `output`."""
    return {
        "id": _new_id("resp"),
        "object": "response",
        "created_at": int(time.time()),
        "status": "completed",
        "error": None,
        "incomplete_details": None,
        "instructions": body.get("instructions"),
        "metadata": body.get("metadata") or {},
        "model": body["model"],
        "output": output,
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "store": body.get("store", True),
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools") or [],
        "usage": used,
    }


def events(response: dict[str, Any]) -> bytes:
    """The SSE events of a `completed` response, as the API streams one whose items come
    whole: no events between an item's added and done, its content only in done."""
    opening = {**response, "status": "in_progress", "output": [], "usage": None}
    sent: list[tuple[str, dict[str, Any]]] = [
        ("response.created", {"response": opening}),
        ("response.in_progress", {"response": opening}),
    ]
    for n, item in enumerate(response["output"]):
        opened = {k: v for k, v in item.items() if k != "encrypted_content"}
        sent.append(("response.output_item.added", {"output_index": n, "item": opened}))
        sent.append(("response.output_item.done", {"output_index": n, "item": item}))
    sent.append(("response.completed", {"response": response}))
    return b"".join(
        f"event: {kind}\ndata: ".encode()
        + orjson.dumps({"type": kind, "sequence_number": n, **fields})
        + b"\n\n"
        for n, (kind, fields) in enumerate(sent)
    )


def _user_message(item: Any) -> dict[str, Any] | None:
    """A user message of the input as the compact endpoint answers it (an item with an id,
    its content as parts); None for every other item."""
    if not (isinstance(item, dict) and item_type(item) == "message" and item.get("role") == "user"):
        return None
    content = item.get("content")
    if isinstance(content, str):
        content = [{"type": "input_text", "text": content}]
    message = {"id": _new_id("msg"), "type": "message", "status": "completed", "role": "user"}
    return message | {"content": content}


def _new_id(prefix: str) -> str:
    return f"{prefix}_{os.urandom(16).hex()}"
