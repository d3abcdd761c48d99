"""Anthropic Messages (`POST /v1/messages`): Claude Code and every Anthropic SDK client.

The conversation is `messages`; `system` and `tools` are never changed (they count as fixed
tokens). Content blocks map to canonical messages and back in `blocks`; the proxy's own
prompt-cache breakpoints are placed by `breakpoints`. The API rejects unknown body fields, so
nothing is ever added to a body but the messages of the view (and breakpoints in them).
"""

from __future__ import annotations

import operator
import re
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple, cast

import orjson

from policies import Message
from proxy.credentials import bearer
from proxy.dialects.anthropic.blocks import (
    REDACTED_THINKING_TOKENS,
    SIGNATURE_TOKENS,
    BadBlock,
    canonical,
    rebuilt,
    thinking_turn,
)
from proxy.dialects.anthropic.breakpoints import with_breakpoints
from proxy.dialects.base import Dialect, Entries, Parsed, Usage
from proxy.dialects.json_checks import refuse_too_deep
from proxy.dialects.raw_items import SPLIT_FROM, ItemBytes, KnownItems, Split
from proxy.errors import APIError, InvalidRequest, SummaryFailed
from proxy.models.tokens import TokenCounter

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    504: "timeout_error",
    529: "overloaded_error",
}
OVERFLOW = ("prompt is too long", "input length and `max_tokens` exceed context limit")
SESSION_HEADER = "x-claude-code-session-id"
# Claude Code's older `metadata.user_id`: user_<hash>_account_<uuid or nothing>_session_<uuid>;
# newer versions send a JSON object as that string, with a `session_id`.
_USER_ID_SESSION = re.compile(r"_session_([0-9A-Za-z-]+)$")
LONG_CONTEXT_BETA = "context-1m-"
LONG_CONTEXT_WINDOW = 1_000_000
TOOL_USE_SYSTEM_TOKENS = 346  # the tool-use system prompt Anthropic adds (its pricing docs)
OAUTH_PREFIX = "sk-ant-oat"  # a subscription's token (Claude Code signed in with an account)
# What count_tokens takes of a Messages request (the API refuses any other field): the prompt
# and what changes its count, not how to answer it. The last two are beta fields.
COUNT_FIELDS = frozenset(
    {
        *("model", "messages", "system", "tools", "tool_choice", "thinking", "cache_control"),
        *("output_config", "speed", "context_management", "mcp_servers"),
    }
)


class Messages(Dialect):
    name = "messages"
    path = "/v1/messages"
    upstream_path = "/messages"  # below a base URL such as https://api.anthropic.com/v1
    conversation_param = "messages"
    call_headers = {"anthropic-version": "2023-06-01"}
    marks_cache = True
    count_path = "/v1/messages/count_tokens"

    def __init__(self, *, split_from: int = SPLIT_FROM) -> None:
        # A message sent before is looked up by its bytes, with its canonical messages, and a
        # body's canonical messages are kept with it (`raw_items`): a replayed turn reads and
        # assembles only what is new.
        self.known = KnownItems(
            _is_object, min_bytes=split_from, derive=_canonical, fold=_assembled
        )

    def parse(self, raw: bytes) -> Parsed:
        try:
            split = self.known.split(raw, "messages")
        except BadBlock:
            split = None  # the whole-body path names the message and block
        if split is None:
            return self.parse_whole(raw)
        return self._parsed(raw, split.body, split.folded, split.raw)

    def parse_whole(self, raw: bytes) -> Parsed:
        """The request read whole, every message mapped: the path of a body the split does
        not read, which says what is wrong with it."""
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise InvalidRequest(f"Invalid JSON body: {exc.msg} at position {exc.pos}") from None
        if not isinstance(body, dict):
            raise InvalidRequest("Invalid request body: expected a JSON object.")
        refuse_too_deep(body)  # what the proxy accepts it must be able to write back out
        try:
            return self._parsed(raw, body, None, None)
        except BadBlock as bad:
            raise InvalidRequest(f"{bad.path}: Input should be {bad.expected}") from None

    def _parsed(
        self,
        raw: bytes,
        body: dict[str, Any],
        assembled: _Assembled | None,
        sent: ItemBytes | None,
    ) -> Parsed:
        """`body` read, with its canonical messages and the client's bytes of each message
        (`sent`) when the split assembled them."""
        model = body.get("model")
        messages = body.get("messages")
        max_tokens = body.get("max_tokens")
        if not isinstance(model, str) or not model:
            raise InvalidRequest("model: Field required")
        if not isinstance(messages, list):
            raise InvalidRequest("messages: Input should be a valid list")
        if max_tokens is not None and (
            isinstance(max_tokens, bool) or not isinstance(max_tokens, int)
        ):
            raise InvalidRequest("max_tokens: Input should be a valid integer")
        if assembled is None:
            each = [canonical(message, index) for index, message in enumerate(messages)]
            assembled = _assemble(each, None, None)
        return Parsed(
            raw=raw,
            body=body,
            model=model,
            messages=assembled.messages,
            items=messages,
            spans=assembled.spans,
            stream=body.get("stream") is True,
            max_output=max_tokens,
            keys=assembled.keys,
            raw_items=sent,
        )

    def error_body(self, error: APIError) -> bytes:
        status = error.status_code
        kind = ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
        return orjson.dumps({"type": "error", "error": {"type": kind, "message": error.message}})

    def session_hint(self, headers: Mapping[str, str], parsed: Parsed) -> str | None:
        named = headers.get(SESSION_HEADER)
        if named:
            return named
        metadata = parsed.body.get("metadata")
        user_id = metadata.get("user_id") if isinstance(metadata, dict) else None
        return user_id_session(user_id) if isinstance(user_id, str) else None

    def fixed_tokens(self, parsed: Parsed, counter: TokenCounter) -> int:
        body = parsed.body
        tokens = 0
        if body.get("system"):
            tokens += counter.message({"role": "system", "content": body["system"]})
        if body.get("tools"):
            tokens += TOOL_USE_SYSTEM_TOKENS + counter.json(body["tools"])
        for block in thinking_turn(parsed.items)[1]:
            if block["type"] == "thinking":
                thinking = block.get("thinking")
                tokens += SIGNATURE_TOKENS + counter.text(
                    thinking if isinstance(thinking, str) else ""
                )
            else:
                tokens += REDACTED_THINKING_TOKENS
        return tokens

    def summary_items(self, header: Message) -> list[Any]:
        # Its own user message, first in `messages`: the API merges it with a user turn
        # that follows, so no kept message is edited to make room for it.
        return [{"role": "user", "content": [{"type": "text", "text": header["content"]}]}]

    def edited_items(self, items: Sequence[Any], original: Message, edited: Message) -> list[Any]:
        return self.shared_items(items, [(original, edited)])

    def shared_items(
        self, items: Sequence[Any], shown: Sequence[tuple[Message, Message | None]]
    ) -> list[Any]:
        message = rebuilt(items[0], shown)
        return [] if message is None else [message]

    def groups(self, parsed: Parsed, entries: Entries) -> list[tuple[int | None, list[Any]]]:
        """The view as native messages, one group per native message: (the index of one of
        its canonical messages shown, None for the header message; the group's items).

        Several canonical messages may stand for the same native message (a user turn holds
        tool results and text): it goes out once, as received when all its canonical messages
        are shown unchanged, else rebuilt by `shared_items` with every edit.
        """
        spans = cast(Sequence[slice], parsed.spans)
        messages, natives = parsed.messages, parsed.items
        # How many canonical messages each native message has, and the first one's place.
        sizes, firsts = [0] * len(natives), [0] * len(natives)
        for position in reversed(range(len(spans))):
            native = spans[position].start
            sizes[native] += 1
            firsts[native] = position
        groups: list[tuple[int | None, list[Any]]] = []
        run: list[tuple[int, Message]] = []  # the canonical messages shown of a shared one

        def flush() -> None:
            index, _ = run[-1]
            native = spans[index].start
            if len(run) == sizes[native] and all(m is messages[i] for i, m in run):
                items = [natives[native]]
            else:
                shown_as, first = dict(run), firsts[native]
                members = range(first, first + sizes[native])
                shown = [(messages[i], shown_as.get(i)) for i in members]
                items = self.shared_items([natives[native]], shown)
            groups.append((index, items))
            run.clear()

        for index, message in entries:
            if index is not None and run and spans[run[0][0]].start != spans[index].start:
                flush()
            if index is None:
                if run:
                    flush()
                groups.append((None, self.summary_items(message)))
            elif sizes[native := spans[index].start] == 1:  # most messages: one of their own
                original = messages[index]
                if message is original:
                    groups.append((index, [natives[native]]))
                else:
                    groups.append((index, self.edited_items([natives[native]], original, message)))
            else:
                run.append((index, message))
        if run:
            flush()
        return groups

    def render(self, parsed: Parsed, entries: Entries, breakpoints: bool = False) -> bytes:
        # Each item with the native message it comes from (None: the header).
        sources: Sequence[int | None]
        last_edit = -1  # the native message of the view's last edited message
        whole = len(entries) == len(parsed.messages) and all(
            map(operator.is_, map(operator.itemgetter(1), entries), parsed.messages)
        )
        if whole:
            items, sources = list(parsed.items), range(len(parsed.items))  # the whole request
        else:
            spans = cast(Sequence[slice], parsed.spans)
            pairs = [
                (item, None if index is None else spans[index].start)
                for index, group in self.groups(parsed, entries)
                for item in group
            ]
            pairs = _systems_after_header(pairs)
            items, sources = [item for item, _ in pairs], [source for _, source in pairs]
            edited = [i for i, m in entries if i is not None and m is not parsed.messages[i]]
            last_edit = spans[edited[-1]].start if edited else -1
        if breakpoints and any(m.get("role") == "assistant" for m in parsed.items):
            # Only a conversation being continued is worth a cache write: its next request
            # reads it back.
            rewritten = not whole and (last_edit >= 0 or None in sources)
            items = self._marked(parsed, items, sources, last_edit if rewritten else None)
        if len(items) == len(parsed.items) and all(map(operator.is_, items, parsed.items)):
            return parsed.raw  # nothing changed, nothing added: the client's own bytes
        return self.body_with(parsed, _as_sent(parsed, items, sources))

    def _marked(
        self,
        parsed: Parsed,
        items: list[Any],
        sources: Sequence[int | None],
        last_edit: int | None,
    ) -> list[Any]:
        """`items` with the proxy's breakpoints, in order of priority:

        1. the end of what the session's plan rewrote (`last_edit`, the native message of its
           last edited message, else the summary; None: it rewrote nothing): the next
           compaction only changes what comes after it, so the prefix up to it is read from
           the cache again when the next compaction forwards a new view;
        2. the last message the next request repeats byte for byte: everything but the
           current tool loop's assistant turn, whose thinking the next request no longer
           carries (the client's own breakpoint on the last message misses because of it).

        Both are found from the end: they are near it.
        """
        repeated = thinking_turn(parsed.items)[0]
        backwards = range(len(sources) - 1, -1, -1)
        rewritten = stable = None
        if last_edit is not None:
            rewritten = next(
                (p for p in backwards if (at := sources[p]) is None or at <= last_edit), None
            )
        stable = next(
            (p for p in backwards if (at := sources[p]) is not None and at < repeated), None
        )
        marks = [position for position in (rewritten, stable) if position is not None]
        return with_breakpoints(parsed.body, parsed.raw, items, marks)

    def wants_usage(self, parsed: Parsed) -> bool:
        return True  # the API always reports it

    def usage(self, payload: bytes) -> Usage | None:
        try:
            body = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return None
        return _usage(body.get("usage") if isinstance(body, dict) else None)

    def stream_usage(self, tail: bytes) -> Usage | None:
        return _event_usage(tail, b"message_delta", reverse=True)

    def stream_start_usage(self, head: bytes) -> Usage | None:
        return _event_usage(head, b"message_start", reverse=False)

    def count_body(self, body: bytes) -> bytes:
        fields = orjson.loads(body)
        return orjson.dumps({k: v for k, v in fields.items() if k in COUNT_FIELDS})

    def counted(self, payload: bytes) -> int | None:
        try:
            tokens = orjson.loads(payload).get("input_tokens")
        except (orjson.JSONDecodeError, AttributeError):
            return None
        return tokens if type(tokens) is int and tokens > 0 else None

    def window(self, headers: Mapping[str, str]) -> int | None:
        betas = headers.get("anthropic-beta", "")
        if any(b.strip().startswith(LONG_CONTEXT_BETA) for b in betas.split(",")):
            return LONG_CONTEXT_WINDOW
        return None

    def may_reuse_credentials(self, credentials: Sequence[tuple[str, str]]) -> bool:
        return not any(
            name in ("authorization", "x-api-key") and bearer(value).startswith(OAUTH_PREFIX)
            for name, value in credentials
        )

    def is_overflow(self, status: int, payload: bytes) -> bool:
        if status != 400:
            return False
        try:
            error = orjson.loads(payload).get("error")
        except (orjson.JSONDecodeError, AttributeError):
            return False
        message = error.get("message") if isinstance(error, dict) else None
        return isinstance(message, str) and message.startswith(OVERFLOW)

    def summary_body(
        self, model: str, system: str, prompt: str, max_tokens: int, temperature: float
    ) -> bytes:
        return orjson.dumps(
            {
                "model": model,
                "max_tokens": max_tokens,
                "system": system,
                "messages": [{"role": "user", "content": prompt}],
                "temperature": temperature,
            }
        )

    def summary_text(self, payload: bytes) -> str:
        message = orjson.loads(payload)
        if message.get("stop_reason") == "max_tokens":
            raise SummaryFailed("overlong")
        return "".join(
            block["text"]
            for block in message.get("content") or ()
            if isinstance(block, dict) and block.get("type") == "text"
        )


def user_id_session(user_id: str) -> str | None:
    """The session id inside Claude Code's `metadata.user_id`, in either of its forms."""
    if user_id.startswith("{"):
        try:
            data = orjson.loads(user_id)
        except orjson.JSONDecodeError:
            return None
        session = data.get("session_id") if isinstance(data, dict) else None
        return session if isinstance(session, str) and session else None
    found = _USER_ID_SESSION.search(user_id)
    return found.group(1) if found else None


def _as_sent(parsed: Parsed, items: list[Any], sources: Sequence[int | None]) -> list[Any]:
    """`items`, each run of native messages that goes out unchanged as the client's bytes of
    it (`ItemBytes.run`) when the body kept them: a view with a breakpoint or two added is
    written in a few pieces, not message by message."""
    sent, natives = parsed.raw_items, parsed.items
    if sent is None:
        return items
    out: list[Any] = []
    start = stop = 0  # the run of unchanged native messages not written yet
    for item, source in zip(items, sources, strict=True):
        if source is not None and item is natives[source]:
            if source != stop:
                out += sent.run(start, stop)
                start = source
            stop = source + 1
        else:
            out += sent.run(start, stop)
            start = stop = 0
            out.append(item)
    out += sent.run(start, stop)
    return out


def _systems_after_header(pairs: list[tuple[Any, int | None]]) -> list[tuple[Any, int | None]]:
    """The items, with the system messages of the evicted part right after the header: the
    engine puts them before it, but the API takes a system message only after a user turn."""
    header = next((i for i, (_, source) in enumerate(pairs) if source is None), None)
    if header is None:
        return pairs
    before = pairs[:header]
    moved = [pair for pair in before if pair[0].get("role") == "system"]
    kept = [pair for pair in before if pair[0].get("role") != "system"]
    return [*kept, pairs[header], *moved, *pairs[header + 1 :]]


def _usage(usage: Any) -> Usage | None:
    """Anthropic's `input_tokens` is what follows the last cache breakpoint: the prompt is that
    plus what was read from and written to the cache."""
    if not isinstance(usage, dict):
        return None
    counts = [
        usage.get(k)
        for k in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
    ]
    if not isinstance(counts[0], int) or isinstance(counts[0], bool):
        return None
    read, created = (c if isinstance(c, int) and not isinstance(c, bool) else 0 for c in counts[1:])
    return Usage(counts[0] + read + created, read, created)


def _event_usage(data: bytes, event: bytes, *, reverse: bool) -> Usage | None:
    """The usage of the first (or last) `event` in some bytes of a stream."""
    lines = data.split(b"\n")
    for line in reversed(lines) if reverse else lines:
        if not (line.startswith(b"data:") and event in line and b'"usage"' in line):
            continue
        try:
            payload = orjson.loads(line[5:].strip())
        except orjson.JSONDecodeError:
            continue
        if not isinstance(payload, dict):
            continue
        holder = payload.get("message") if event == b"message_start" else payload
        usage = _usage(holder.get("usage") if isinstance(holder, dict) else None)
        if usage is not None:
            return usage
    return None


def _is_object(message: Any) -> bool:
    return message.__class__ is dict


def _canonical(message: Any) -> list[Message]:
    """A message's canonical messages, whatever its place (only an error names the place)."""
    return canonical(message, 0)


class _Assembled(NamedTuple):
    """The canonical messages of a request's first `read` messages, where each comes from,
    and (from the split) a content key of each: of its native message's bytes and its place
    among that message's canonical ones."""

    messages: list[Message]
    spans: list[slice]
    keys: list[int] | None
    read: int


def _assemble(
    each: Sequence[list[Message]], keys: Sequence[int] | None, after: _Assembled | None
) -> _Assembled:
    """`after`'s canonical messages, then those of the messages after them (`each` of every
    message; `keys`, the keys of their bytes, when the body was split)."""
    start = 0 if after is None else after.read
    messages = [] if after is None else list(after.messages)
    spans = [] if after is None else list(after.spans)
    made = [] if after is None or after.keys is None else list(after.keys)
    for index in range(start, len(each)):
        found = each[index]
        messages += found
        spans += [slice(index, index + 1)] * len(found)
        if keys is not None:
            made += [hash((keys[index], n)) for n in range(len(found))]
    return _Assembled(messages, spans, None if keys is None else made, len(each))


def _assembled(split: Split, after: _Assembled | None) -> _Assembled:
    """The canonical messages of a split body (its messages' were derived one by one)."""
    return _assemble(cast(list[list[Message]], split.derived), split.keys, after)
