"""The Responses API's `compaction` items that the proxy issues itself, and their expansion.

When the proxy serves provider compaction (policy `provider_compaction: serve`), its answer is
a `compaction` item whose `encrypted_content` is the proxy's own:

    "cpx1:" + base64url( mac[16] | zlib( JSON {"text": summary, "kind": "llm" | "digest"} ) )

`mac` is HMAC-SHA256, under the configured signing key, of the owner and the rest: no client
can make the proxy forward text of its own as a summary. The owner is the caller's inbound key
id where `auth.keys` names callers, and the item opens for that caller only; without them the
owner is "" (a credential's hash changes as keys rotate), and the item opens for whoever
holds it. It is signed, not encrypted: the summary is of the caller's own conversation, which
the caller holds anyway.

Whenever such an item comes back in a request, `expand` puts the summary message in its place
before anything else reads the request, so that no upstream ever receives an item it cannot
read; every other item stays the very object received. Other `compaction` items (the
provider's own) are not the proxy's and stay as they are.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import zlib
from collections.abc import Callable, Sequence
from typing import Any

import orjson

from policies import Message, Summary, header_message
from proxy.errors import InvalidRequest

PREFIX = "cpx1:"
MARKER = PREFIX.encode()  # present in a raw body that may hold one of the proxy's items
_MAC_BYTES = 16
_MAX_SUMMARY_BYTES = 1 << 22  # more than any summary the proxy writes


class CompactionSeal:
    """Issues and opens the proxy's compaction items under one signing key."""

    def __init__(self, key: bytes) -> None:
        self._key = key

    def seal(self, tenant: str, summary: Summary) -> str:
        """The `encrypted_content` of a compaction item standing for `summary`."""
        body = zlib.compress(orjson.dumps({"text": summary.shown, "kind": summary.kind}))
        return PREFIX + base64.urlsafe_b64encode(self._mac(tenant, body) + body).decode()

    def open(self, tenant: str, content: str, where: str) -> Summary:
        """The summary an item of the proxy stands for; a 400 naming `where` when it was not
        issued to `tenant` by this key, or was altered."""
        try:
            raw = base64.b64decode(content.removeprefix(PREFIX), altchars=b"-_", validate=True)
        except (binascii.Error, ValueError):
            raw = b""
        mac, body = raw[:_MAC_BYTES], raw[_MAC_BYTES:]
        if len(mac) < _MAC_BYTES or not hmac.compare_digest(mac, self._mac(tenant, body)):
            raise InvalidRequest(
                f"The encrypted content for item {where} could not be verified: it is not a"
                " compaction item this proxy issued to this caller (altered, another caller's,"
                " or signed with another key).",
                param=where,
                code="invalid_encrypted_content",
            )
        # Authentic, so made by `seal`; the inflated size is bounded all the same.
        data = orjson.loads(zlib.decompressobj().decompress(body, _MAX_SUMMARY_BYTES))
        return Summary(str(data["text"]), "llm" if data.get("kind") == "llm" else "digest")

    def _mac(self, tenant: str, body: bytes) -> bytes:
        message = PREFIX.encode() + tenant.encode() + b"\0" + body
        return hmac.new(self._key, message, hashlib.sha256).digest()[:_MAC_BYTES]


def is_proxy_item(item: Any) -> bool:
    """Whether `item` is a compaction item the proxy issued (or one made to look like it)."""
    return (
        isinstance(item, dict)
        and item.get("type") == "compaction"
        and isinstance(item.get("encrypted_content"), str)
        and item["encrypted_content"].startswith(PREFIX)
    )


def expand(
    items: Sequence[Any],
    opened: Callable[[str, str], Summary],
    summary_items: Callable[[Message], list[Any]],
    role: str,
) -> list[Any] | None:
    """`items` with each of the proxy's compaction items replaced by its summary message
    (`opened(encrypted_content, where)` reads it, `summary_items` writes the message in the
    API's form, `role` its role); None when there is none. Every other item is the object
    received, in its place."""
    if not any(map(is_proxy_item, items)):
        return None
    out: list[Any] = []
    for index, item in enumerate(items):
        if not is_proxy_item(item):
            out.append(item)
            continue
        summary = opened(item["encrypted_content"], f"input[{index}]")
        header = header_message(summary, None, role)
        if header is not None:
            out += summary_items(header)
    return out
