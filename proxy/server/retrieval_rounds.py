"""Hidden rounds: an answer that calls only the proxy's retrieval tool is answered by the proxy
itself, the conversation continued upstream, and the next answer taken instead, at most the
policy's `max_rounds` times per request. The client gets the last answer, with the usage of
every upstream call added up, and never a call of the proxy's tool:

- called beside client tools, the proxy's calls are taken out of the answer (the client gets
  its own calls, each of which it can answer; the model may ask again on the next turn);
- still called after `max_rounds`, they are taken out too, and an answer left empty says so.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson

from policies.retrieval import excerpt
from proxy.compaction.kept_originals import KeptOriginals
from proxy.compaction.turn import ClientRequest
from proxy.config import Retrieval, Upstream
from proxy.dialects.retrieval import TOOL_CALLS, Call
from proxy.dialects.sse import EventStream
from proxy.errors import AnswerTooLarge, StoreUnavailable, UpstreamUnreachable
from proxy.observability.retrieval_metrics import RetrievalMetrics
from proxy.server.relay import after
from proxy.sessions.originals import OriginalsIndex
from proxy.upstream.answer import UpstreamResponse, read_whole

log = logging.getLogger("compaction_proxy")

# The continued request's body -> the upstream's status and whole answer.
Send = Callable[[bytes], Awaitable[tuple[int, bytes]]]

INVALID = 'invalid arguments: give {"handle": "..."}, optionally start_line and end_line'
LIMIT_NOTE = "[the conversation's kept tool outputs could not be read further in this turn]"


@dataclasses.dataclass(frozen=True)
class Held:
    """A streamed answer read until it showed whether it calls the proxy's tool: the stream
    as the client gets it (the bytes held, then the rest, a later call of the proxy's tool
    taken out); or, when its first call was the proxy's, the client's answer settled (its
    events written whole)."""

    stream: AsyncIterator[bytes] | None
    settled: Settled | None = None


@dataclasses.dataclass(frozen=True)
class Settled:
    """The answer the client gets, its status, and what the proxy's tool did for it."""

    status: int
    payload: bytes
    first: bytes  # the first upstream answer (its usage is that of the forwarded request)
    rounds: int = 0
    retrievals: int = 0


class RetrievalRounds:
    def __init__(self, kept: KeptOriginals, metrics: RetrievalMetrics) -> None:
        self.kept = kept
        self.metrics = metrics

    async def settle(
        self, request: ClientRequest, body: bytes, payload: bytes, send: Send
    ) -> Settled:
        """`payload`, the upstream's answer to `body`, with the proxy's own calls answered."""
        settings = request.policy.retrieval
        calls = TOOL_CALLS[request.dialect.name]
        answer = _json(payload)
        if answer is None:
            return Settled(200, payload, payload)
        first, usages, rounds, retrievals = payload, [answer.get("usage")], 0, 0
        sent: dict[str, Any] | None = None  # the last continued request (read when needed)
        while True:
            made = calls.calls(answer)
            ours = [c for c in made if c.name == settings.tool_name]
            if not ours:
                break
            if len(ours) < len(made) or rounds >= settings.max_rounds:
                self.metrics.mixed.labels(request.dialect.name).inc(len(ours))
                answer = calls.without_calls(answer, settings.tool_name, LIMIT_NOTE)
                break
            results = [(call, await self._result(request, settings, call)) for call in ours]
            retrievals += len(results)
            sent = calls.continued(sent or orjson.loads(body), answer, results)
            rounds += 1
            self.metrics.rounds.labels(request.dialect.name).inc()
            status, payload = await send(orjson.dumps(sent))
            following = _json(payload) if status == 200 else None
            if following is None:  # the upstream's error (or odd answer), as it came
                return Settled(status, payload, first, rounds, retrievals)
            answer = following
            usages.append(answer.get("usage"))
        if rounds == 0 and not ours:
            return Settled(200, payload, first)  # nothing of the proxy's: the bytes as they came
        answer = calls.with_usage(answer, usages)
        if sent is not None:
            await self._keep_round(request, calls.answer_key(answer), orjson.loads(body), sent)
        return Settled(200, orjson.dumps(answer), first, rounds, retrievals)

    async def _keep_round(
        self, request: ClientRequest, answer: str | None, first: dict[str, Any], last: Any
    ) -> None:
        """Keep the hidden rounds' items with the session, to put back before the answer in
        its later requests (the client never saw them)."""
        items = TOOL_CALLS[request.dialect.name].hidden_items(first, last)
        if answer is None or not items:
            return
        try:
            await self.kept.originals.put_round(request.key, answer, orjson.dumps(items))
        except StoreUnavailable:
            log.warning("hidden round not kept: the session store failed")

    async def restore(self, request: ClientRequest) -> tuple[bytes | None, OriginalsIndex | None]:
        """The request's body with the session's hidden rounds put back before the answers
        they led to (None when it has none to put back, or under shadow mode), and the
        session's kept originals as read (None when the store failed)."""
        calls = TOOL_CALLS[request.dialect.name]
        conversation = request.parsed.body.get(calls.conversation_key)
        originals = self.kept.originals
        try:
            index = await originals.index(request.key)
            wanted = set(index.rounds)
            items = conversation if isinstance(conversation, list) and wanted else []
            found = []
            for position, item in enumerate(items):
                key = calls.item_key(item)
                data = None if key not in wanted else await originals.read_round(request.key, key)
                if data is not None:
                    found.append((position, orjson.loads(data)))
        except StoreUnavailable:
            return None, None
        if not found or request.shadow:
            return None, index
        return orjson.dumps(calls.restored(request.parsed.body, found)), index

    async def hold(
        self, request: ClientRequest, body: bytes, chunks: AsyncIterator[bytes], send: Send
    ) -> Held:
        """Read a streamed answer to `body` only as far as its first tool call (all of it when
        it has none): another's goes on as it came, byte for byte; the proxy's own is read to
        its end, answered as a whole answer is (`settle`, the hidden rounds not streamed), and
        the client's answer written as the API's events."""
        settings = request.policy.retrieval
        calls = TOOL_CALLS[request.dialect.name]
        reader, events, held = calls.stream(), EventStream(), bytearray()
        while (chunk := await anext(chunks, b"")) != b"":
            held += chunk
            for data in events.feed(chunk):
                event = _json(data)
                if event is not None:
                    reader.feed(event)
            if reader.first_call not in (None, settings.tool_name):
                break
        if reader.first_call != settings.tool_name:
            relayed = after(bytes(held), chunks)
            return Held(calls.call_filter(settings.tool_name).filtered(relayed))
        whole = {**orjson.loads(body), "stream": False}
        whole.pop("stream_options", None)
        answer = orjson.dumps(reader.answer())
        settled = await self.settle(request, orjson.dumps(whole), answer, send)
        if settled.status != 200:
            return Held(None, settled)
        wants_usage = request.dialect.wants_usage(request.parsed)
        written = calls.events(orjson.loads(settled.payload), wants_usage)
        return Held(None, dataclasses.replace(settled, payload=written))

    async def _result(self, request: ClientRequest, settings: Retrieval, call: Call) -> str:
        """The tool's result for one call: the original (or its lines), else why not."""
        try:
            arguments = orjson.loads(call.arguments or b"{}")
            handle = arguments["handle"]
            start, end = arguments.get("start_line"), arguments.get("end_line")
            if not isinstance(handle, str) or not all(
                v is None or (isinstance(v, int) and not isinstance(v, bool)) for v in (start, end)
            ):
                raise TypeError
        except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
            self.metrics.retrievals.labels("invalid").inc()
            return (
                'invalid arguments: give {"handle": "<handle>"}, optionally start_line and end_line'
            )
        try:
            data = await self.kept.read(request.key, handle)
        except StoreUnavailable:
            self.metrics.retrievals.labels("unavailable").inc()
            return "the kept outputs cannot be read now (the store failed); go on without it"
        if data is None:
            self.metrics.retrievals.labels("unknown").inc()
            return f"no output is kept under handle {handle[:40]!r} in this conversation (any more)"
        text = excerpt(data.decode(), start, end, settings.max_result_chars)
        self.metrics.retrievals.labels("served").inc()
        self.metrics.bytes_served.inc(len(text.encode()))
        return text


def whole_answers(
    open_upstream: Callable[[bytes], Awaitable[UpstreamResponse]], idle: float, upstream: Upstream
) -> Send:
    """The hidden rounds' calls: each body sent upstream, its answer read whole."""

    async def send(body: bytes) -> tuple[int, bytes]:
        answer = await open_upstream(body)
        try:
            payload = await read_whole(answer, idle, upstream.max_answer_bytes)
        except AnswerTooLarge as exc:
            raise UpstreamUnreachable(
                f"upstream {upstream.name!r} answered a hidden round with more than its "
                "max_answer_bytes"
            ) from exc
        answer.release()
        return answer.status, payload

    return send


def _json(payload: bytes) -> dict[str, Any] | None:
    if payload.startswith(b"[DONE]"):
        return None
    try:
        answer = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return None
    return answer if isinstance(answer, dict) else None
