"""What a wire format (a *dialect*) must tell the request path, and nothing else does.

The engine (`policies/`) works on one canonical conversation: OpenAI-chat-like messages
(system / user / assistant with `tool_calls` / tool). A dialect turns a client's request into
that conversation plus a map back to its own native items, and turns a compacted view back
into a request body, leaving every untouched native item exactly as the client sent it.
Sessions, plans, layers, summaries, headers and metrics are the same for every dialect.
What only some wire formats have (a count endpoint, cache breakpoints...) is in `capabilities`.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import orjson
from starlette.responses import Response

from policies import Message, is_compaction_request
from policies.plan import View
from proxy.errors import APIError
from proxy.models.tokens import TokenCounter

if TYPE_CHECKING:
    from proxy.dialects.item_bytes import ItemBytes

Entries = Sequence[tuple[int | None, Message]]


@dataclasses.dataclass(frozen=True, eq=False)
class Parsed:
    """One client request, read and checked by its dialect.

    `messages` is the canonical conversation; canonical message `i` stands for the native
    items `items[spans[i]]`, or for `items[i]` alone when `spans` is None (chat completions;
    for the Responses API a function call and the reasoning item before it, say).
    `opaque_reason` says why the proxy cannot see the whole conversation (it is held
    upstream, e.g. `previous_response_id`): such a request is forwarded unchanged.
    `keys` is each message's content key for the per-message memos (`proxy.memo`), when the
    dialect has one cheaper than `content_keys` (the hash of the client's bytes of it).
    `raw_items` are the client's bytes of each native item, when the dialect kept them: an
    item no layer touched goes upstream as them. `marks` is how often the dialect's
    `KnownItems.marks` is in `raw`, when its split counted them.
    The messages (their list too, and `body`'s values) may be shared with other requests,
    memoised by their bytes (`raw_items`): nothing may change them in place.
    """

    raw: bytes
    body: dict[str, Any]
    model: str
    messages: list[Message]
    items: Sequence[Any]
    spans: Sequence[slice] | None
    stream: bool
    max_output: int | None
    opaque_reason: str | None = None
    keys: Sequence[int] | None = None
    raw_items: ItemBytes | None = None
    marks: int | None = None

    def native(self, index: int) -> Sequence[Any]:
        """The native items canonical message `index` stands for."""
        if self.spans is None:
            return self.items[index : index + 1]
        return self.items[self.spans[index]]


@dataclasses.dataclass(frozen=True)
class Usage:
    """The upstream's own count of the prompt it was sent, from its response."""

    prompt_tokens: int  # the whole prompt, whether read from a cache or not
    cached_tokens: int | None = None  # of which read from the upstream's prompt cache
    cache_creation_tokens: int | None = None  # of which written to it (Anthropic)


class Dialect(ABC):
    """One wire format: `/v1/chat/completions`, `/v1/responses`, `/v1/messages`."""

    name: ClassVar[str]  # as config routes name it: chat, responses, messages
    path: ClassVar[str]  # the inbound path
    upstream_path: ClassVar[str]  # relative to the upstream's base URL
    conversation_param: ClassVar[str]  # the body field holding the conversation
    # Request headers that the proxy's own calls in this API (summaries) carry besides the
    # credential, with the value they take when the request has none.
    call_headers: ClassVar[Mapping[str, str]] = {}

    @abstractmethod
    def parse(self, raw: bytes) -> Parsed:
        """The request, checked just enough for compaction; InvalidRequest otherwise."""

    @abstractmethod
    def error_body(self, error: APIError) -> bytes:
        """The proxy's own error in this API's error shape."""

    def error_response(self, error: APIError) -> Response:
        return Response(
            self.error_body(error),
            status_code=error.status_code,
            headers=dict(error.headers),
            media_type="application/json",
        )

    @abstractmethod
    def session_hint(self, headers: Mapping[str, str], parsed: Parsed) -> str | None:
        """The session id the client itself names (its own header or body field), if any."""

    def client_compaction(self, parsed: Parsed) -> bool:
        """Whether the request is the client's own compaction: it asks for a summary of its
        history, to replace the history with (`policies.client_context`)."""
        return is_compaction_request(parsed.messages)

    @abstractmethod
    def fixed_tokens(self, parsed: Parsed, counter: TokenCounter) -> int:
        """Tokens of the prompt outside the conversation (tools, instructions, priming)."""

    @abstractmethod
    def summary_items(self, header: Message) -> list[Any]:
        """The native form of the engine's summary / anchor block message."""

    @abstractmethod
    def edited_items(self, items: Sequence[Any], original: Message, edited: Message) -> list[Any]:
        """The native items of a canonical message that a layer edited."""

    def body_with(self, parsed: Parsed, items: list[Any]) -> bytes:
        """The request body with its conversation replaced by `items`: bytes are the client's
        own of an item or of a run of items (`ItemBytes.run`), written as they came."""
        conversation = [orjson.Fragment(i) if i.__class__ is bytes else i for i in items]
        return orjson.dumps({**parsed.body, self.conversation_param: conversation})

    @abstractmethod
    def wants_usage(self, parsed: Parsed) -> bool:
        """Whether the client asked for usage (the proxy never adds what was not asked)."""

    @abstractmethod
    def usage(self, payload: bytes) -> Usage | None:
        """Usage from a whole (non-streamed) response body."""

    @abstractmethod
    def stream_usage(self, tail: bytes) -> Usage | None:
        """Usage from the last bytes of a streamed response."""

    @abstractmethod
    def is_overflow(self, status: int, payload: bytes) -> bool:
        """Whether an upstream error says the prompt is over the context window."""

    @abstractmethod
    def summary_body(
        self, model: str, system: str, prompt: str, max_tokens: int, temperature: float
    ) -> bytes:
        """A request for a summary: `system` as the instructions, `prompt` as the user's turn,
        at most `max_tokens` of summary, non-streamed."""

    @abstractmethod
    def summary_text(self, payload: bytes) -> str:
        """The summary in a successful answer; SummaryFailed("overlong") when it was cut off
        (a summary that lost its end lost its last sections)."""

    def render(self, parsed: Parsed, entries: Entries) -> bytes:
        """The body that forwards the view `entries` (from `policies.render_entries`).

        Here each canonical message stands for native items of its own (the dialects whose
        messages share items render them together: Anthropic's). The untouched messages'
        items go as runs of the client's bytes (`ItemBytes.run`) when it kept them; a `View`
        is read by its runs, a step per run rather than per message."""
        items: list[Any] = []
        spans, messages, sent = parsed.spans, parsed.messages, parsed.raw_items

        def untouched(start: int, stop: int) -> Sequence[Any]:
            return parsed.items[start:stop] if sent is None else sent.run(start, stop)

        start = stop = 0  # the run of untouched items not written yet
        for run in entries.runs if isinstance(entries, View) else entries:
            if isinstance(run, range):
                first, last = run.start, run.stop - 1  # messages shown as they are
            else:
                index, message = run
                if index is None or message is not messages[index]:
                    items += untouched(start, stop)
                    start = stop = 0
                    if index is None:
                        items += self.summary_items(message)
                    else:
                        items += self.edited_items(parsed.native(index), messages[index], message)
                    continue
                first = last = index
            if spans is not None:  # the messages' native items
                first, last = spans[first].start, spans[last].stop - 1
            if first != stop:
                items += untouched(start, stop)
                start = first
            stop = last + 1
        items += untouched(start, stop)
        return self.body_with(parsed, items)
