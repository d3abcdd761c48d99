"""Which conversation a request belongs to.

The session id comes from the configured header, else `metadata.session_id` in the body,
else it is derived from the first user message (system prompts change from day to day, so
they are left out). It is only ever used hashed with the tenant (see store.session_key).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import orjson

MAX_SESSION_ID = 256


def session_id(header_value: str | None, body: Mapping[str, Any]) -> str:
    if header_value:
        return header_value[:MAX_SESSION_ID]
    metadata = body.get("metadata")
    if isinstance(metadata, dict):
        value = metadata.get("session_id")
        if isinstance(value, str) and value:
            return value[:MAX_SESSION_ID]
    return derived_session_id(body.get("messages") or [])


def derived_session_id(messages: list[Any]) -> str:
    """A stable id from the first user message (and the model-independent rest: nothing)."""
    first = next(
        (m for m in messages if isinstance(m, dict) and m.get("role") == "user"),
        None,
    )
    content = first.get("content") if first else None
    digest = hashlib.sha256(orjson.dumps(content)).hexdigest()
    return f"derived-{digest[:24]}"
