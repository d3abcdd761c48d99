"""The hash chain that identifies a conversation prefix, system messages (and the clients' own
context, `policies.client_context`) excluded.

A plan applies to a request only when the chain prefix it was computed over is unchanged.
Messages are hashed in a canonical form, so that what SDKs echo back differently (null
fields, `refusal: null`, `annotations: []`, a text part instead of a string) does not count.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from policies.client_context import outside_chain
from policies.message import call_arguments, call_name, tool_calls

DIGEST_SIZE = 8


def canonical(message: Mapping[str, Any]) -> bytes:
    """The canonical form of a message: role, content, tool calls, tool_call_id, name."""
    fields = [
        _text(message.get("role")),
        _content(message.get("content")),
        _text(message.get("tool_call_id")),
        _text(message.get("name")),
    ]
    for call in tool_calls(message):
        fields += (_text(call.get("id")), call_name(call), call_arguments(call))
    # Unit separators: the fields are few and fixed, and a history is only ever compared with
    # the same session's history, so text holding a separator is not worth an escape.
    return "\x1f".join(fields).encode("utf-8", "surrogatepass")


def message_digest(message: Mapping[str, Any]) -> bytes:
    """A short hash of the canonical form of one message."""
    return hashlib.blake2b(canonical(message), digest_size=DIGEST_SIZE).digest()


OUTSIDE = b""
"""`chain_digest` of a message outside the chain (no digest is empty)."""


def chain_digest(message: Mapping[str, Any]) -> bytes:
    """A message's digest in the chain, `OUTSIDE` when it stands outside it (a system message,
    a client's context): both depend on nothing but the message, so one memo serves both."""
    return OUTSIDE if outside_chain(message) else message_digest(message)


def chain_digests(messages: Sequence[Mapping[str, Any]]) -> list[bytes]:
    """The `chain_digest` of each message."""
    return [chain_digest(m) for m in messages]


Digests = Callable[[Sequence[Mapping[str, Any]]], Sequence[bytes]]
"""A function giving the `chain_digest` of each of a list of messages, as `chain_digests`."""


class Chain:
    """The non-system messages of a conversation, each by its digest.

    `prefix(n)` identifies the first n of them; a plan stores it for the prefix it covers.
    `outside` is where the messages outside the chain stand, as `outside_positions` says.
    """

    def __init__(
        self,
        digests: list[bytes],
        outside: dict[int, int] | None = None,
        prefixes: dict[int, str] | None = None,
    ) -> None:
        self.digests = digests
        self.outside: dict[int, int] = {} if outside is None else outside
        # `prefix(n)` once worked out: every turn checks its branches' prefixes.
        self._prefixes: dict[int, str] = {} if prefixes is None else prefixes

    @classmethod
    def of(cls, messages: Sequence[Mapping[str, Any]], digests: Digests = chain_digests) -> Chain:
        """The chain of the non-system `messages`; `digests` gives each message's
        `chain_digest` (the proxy passes one that memoises them)."""
        return cls([]).followed_by(digests(messages))

    def followed_by(self, digests: Sequence[bytes]) -> Chain:
        """The chain of this chain's messages followed by messages of these `chain_digest`s:
        a conversation that grew (this one is left as it is)."""
        found = list(digests)
        start = len(self.digests) + len(self.outside)  # the messages so far
        outside = dict(self.outside)
        # A step per message outside the chain, not per message: a list's own search.
        at = -1
        for _ in range(found.count(OUTSIDE)):
            at = found.index(OUTSIDE, at + 1)
            outside[start + at] = start + at - len(outside)
        if len(outside) > len(self.outside):
            found = list(filter(None, found))
        # The prefixes of this chain are those of the longer one.
        return Chain(self.digests + found, outside, dict(self._prefixes))

    def __len__(self) -> int:
        return len(self.digests)

    def prefix(self, n: int) -> str:
        """The hash of the first n messages ("" for none, or for more than there are)."""
        if n <= 0 or n > len(self.digests):
            return ""
        found = self._prefixes.get(n)
        if found is None:
            joined = b"".join(self.digests[:n])
            found = hashlib.blake2b(joined, digest_size=2 * DIGEST_SIZE).hexdigest()
            self._prefixes[n] = found
        return found


def _text(value: object) -> str:
    if value.__class__ is str:
        return value
    return "" if value is None else json.dumps(value, sort_keys=True, default=str)


def _content(content: object) -> str:
    """The text, with each other part as its type and a hash: `[text, image]` ~ text+image."""
    if not isinstance(content, list):
        return _text(content)
    pieces = []
    for part in content:
        if isinstance(part, dict) and part.get("type") == "text":
            pieces.append(_text(part.get("text")))
        else:
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            form = json.dumps(part, sort_keys=True, default=str).encode("utf-8", "surrogatepass")
            pieces.append(
                f"\0{kind}:{hashlib.blake2b(form, digest_size=DIGEST_SIZE).hexdigest()}\0"
            )
    return "".join(pieces)
