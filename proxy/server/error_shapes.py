"""Which API's error shape the proxy's own error takes, before or outside an API's endpoint
(a refusal at the gate or in the protocol, a passthrough call, a path not served).

An API's path takes its API's shape. Any other request takes Anthropic's when it comes from an
Anthropic client, which sends `anthropic-version` on every call of Anthropic's API (models,
batches, ...): its SDK reads errors in that shape; else OpenAI's.
"""

from __future__ import annotations

from collections.abc import Iterable

from proxy.dialects import Dialect
from proxy.dialects.anthropic.messages import Messages
from proxy.dialects.openai.chat import Chat
from proxy.dialects.openai.responses import Responses

MESSAGES, OPENAI = Messages(), Chat()
ANTHROPIC_VERSION = b"anthropic-version"
# Every path of an OpenAI API the proxy serves (the Responses API's /compact among them).
_OPENAI_PATHS = (OPENAI.path, Responses.path)


def anthropic_client(headers: Iterable[tuple[bytes, bytes]]) -> bool:
    """Whether a request's headers (ASGI's: names in lower case) are an Anthropic client's."""
    return any(name == ANTHROPIC_VERSION for name, _ in headers)


def error_shape(path: str, headers: Iterable[tuple[bytes, bytes]]) -> Dialect:
    """The API whose error shape answers a request for `path` with `headers`."""
    if path.startswith(MESSAGES.path):  # and its count_tokens
        return MESSAGES
    if not path.startswith(_OPENAI_PATHS) and anthropic_client(headers):
        return MESSAGES
    return OPENAI
