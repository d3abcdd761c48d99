"""What every fake server of the tests stands on.

`FakeServer`: a server on 127.0.0.1 in a thread with its own event loop (an aiohttp app by
default), the requests it received and its counters, `wait_for` woken on each change; the
scripted upstream serves raw connections on it.
`FakeAPI`, for the fakes of an LLM API: each request's JSON recorded, its behaviours read (the
``x-fake-behavior`` header, else the fake's `behavior`), the fake's own errors answered in its
API's shape, answers streamed event by event (slowly, reset or failed midway when asked), the
summarizer hook, a scripted model (`script`), the usage of every answer kept with its request
(`answered`), and the command line that serves a fake until Ctrl-C.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import inspect
import socket
import struct
import threading
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, ClassVar, Generic, Self, TypedDict, TypeVar

import orjson
import uvloop
from aiohttp import web

BEHAVIOR_HEADER = "x-fake-behavior"
# The signing key of the fakes that recorded tests/data/clients (bench/agent_clients.py): fakes
# given it accept the encrypted reasoning and the thinking signatures those requests carry.
RECORDING_KEY = b"compaction-proxy agents-e2e"

SummaryResult = str | Exception | None
Summarizer = Callable[[dict[str, Any]], SummaryResult | Awaitable[SummaryResult]]
# The behaviours a fake understands, each with how its argument is read.
Behaviors = Mapping[str, Callable[[str], object]]
Recorded = TypeVar("Recorded")  # what a fake keeps of each request


@dataclass(frozen=True)
class Scripted:
    """A scripted model's answer: a call of the request's tool named `tool` with `arguments`
    (a JSON object for a function tool, the input text for a custom one), else `text`."""

    text: str = ""
    tool: str | None = None
    arguments: Any = None


# A scripted model (the fakes' `script`): the answer to a request's headers and body, or None
# for the fake's own answer. Summary requests never reach it.
Script = Callable[[Mapping[str, str], dict[str, Any]], Scripted | None]


class Settings(TypedDict, total=False):
    """What every fake API can be given (FakeAPI's keywords), besides its own."""

    windows: Mapping[str, int] | None
    behavior: str
    stream_delay: float
    summarizer: Summarizer
    summary_delay: float
    script: Script | None
    api_key: str | None
    record: bool
    port: int


def default_summary(body: dict[str, Any]) -> str:
    """The summarizer hook unless a test sets one: how much it was asked to summarise."""
    if "messages" in body:
        return f"Summary of {len(body['messages'])} messages."
    given = body.get("input")
    items = given if isinstance(given, list) else [] if given is None else [given]
    return f"Summary of {len(items)} input items."


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str  # as sent, percent-encoded
    query: str
    headers: Mapping[str, str]  # case-insensitive
    body: bytes
    json: Any  # the parsed body, None when it is not JSON


@dataclass(frozen=True)
class Answered:
    """The usage a fake reported in an answer, and the request it answered."""

    request: RecordedRequest
    usage: Mapping[str, Any]  # as the API reports it


_RECORDED = web.RequestKey("recorded", RecordedRequest)


def parse_behavior(raw: str, known: Behaviors) -> dict[str, str]:
    """``"slow-stream:0.1, gzip"`` -> ``{"slow-stream": "0.1", "gzip": ""}``; ValueError for a
    behaviour not `known`, or an argument it cannot read."""
    behaviors = {}
    for item in filter(None, (part.strip() for part in raw.split(","))):
        name, _, arg = item.partition(":")
        try:
            convert = known[name]
            if arg or name == "status":
                convert(arg)
        except (KeyError, ValueError):
            raise ValueError(f"unknown fake behavior {item!r}") from None
        behaviors[name] = arg
    return behaviors


class FakeServer(Generic[Recorded]):
    """A fake on 127.0.0.1 (`port` 0: a free one), served from a thread with its own loop: an
    aiohttp app whose every request goes to `_handle` (`_serve` and `_shut` say otherwise). It
    remembers its traffic: the requests (when `record`) and counters."""

    api_path: ClassVar[str] = ""  # where the API is below the origin: base_url

    def __init__(
        self, *counters: str, record: bool = True, port: int = 0, max_body_bytes: int = 2**20
    ) -> None:
        self.record = record  # off for benchmarks, whose bodies would pile up
        self.port = port
        self.client_max_size = max_body_bytes
        self._changed = threading.Condition(threading.RLock())
        self._requests: list[Recorded] = []
        self._counts = dict.fromkeys(("cancelled", *counters), 0)
        self._closing = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return self.origin + self.api_path

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> None:
        sock = socket.create_server(("127.0.0.1", self.port))
        self.port = sock.getsockname()[1]
        self._closing = False
        self._loop = uvloop.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._serve(sock), self._loop).result(timeout=10)

    def stop(self) -> None:
        if self._loop is None or self._thread is None:
            return
        self._closing = True  # handlers cancelled by the shutdown are not client cancellations
        asyncio.run_coroutine_threadsafe(self._shut(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()
        self._loop = self._thread = None

    async def _serve(self, sock: socket.socket) -> None:
        app = web.Application(client_max_size=self.client_max_size)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        app.on_response_prepare.append(self._prepare)
        # a client that goes away cancels its handler, which is how cancellations are seen
        self._runner = web.AppRunner(
            app, handler_cancellation=True, shutdown_timeout=0.1, access_log=None
        )
        await self._runner.setup()
        await web.SockSite(self._runner, sock).start()

    async def _shut(self) -> None:
        assert self._runner is not None
        await self._runner.cleanup()
        self._runner = None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raise NotImplementedError

    async def _prepare(self, request: web.Request, response: web.StreamResponse) -> None:
        """Headers every answer of the fake carries (a request id)."""

    @property
    def requests(self) -> list[Recorded]:
        """A snapshot of the requests received, oldest first."""
        with self._changed:
            return list(self._requests)

    @property
    def cancelled(self) -> int:
        """Requests whose client went away before the answer was complete."""
        return self.counter("cancelled")

    def counter(self, name: str) -> int:
        with self._changed:
            return self._counts[name]

    def bump(self, name: str) -> None:
        """Add one to a counter and wake wait_for."""
        with self._changed:
            self._counts[name] += 1
            self._changed.notify_all()

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
        """Block until predicate() is true (re-checked on every request and count), or timeout.

        From a coroutine on a loop that serves the proxy, call it via ``asyncio.to_thread``.
        """
        with self._changed:
            return self._changed.wait_for(predicate, timeout)

    def _forget(self) -> None:
        """The requests and counters, back to none (the caller holds the lock)."""
        self._requests.clear()
        self._counts = dict.fromkeys(self._counts, 0)

    def _record(self, request: Recorded) -> Recorded | None:
        """Keep the request (when recording): what was kept."""
        if not self.record:
            return None
        with self._changed:
            self._requests.append(request)
            self._changed.notify_all()
        return request

    async def _receive(
        self: FakeServer[RecordedRequest], request: web.Request
    ) -> tuple[bytes, Any, RecordedRequest | None]:
        """The body of an aiohttp request, raw and parsed (None when it is not JSON), and its
        record (None when not recording)."""
        raw = await request.read()
        try:
            data = orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError:
            data = None
        kept = self._record(recorded(request, raw, data))
        if kept is not None:
            request[_RECORDED] = kept  # for note_usage
        return raw, data, kept


class FakeAPI(FakeServer[RecordedRequest]):
    """A fake LLM API. Each request is recorded with its JSON, its behaviours are read
    (`known_behaviors`: the header, else `behavior`), and `_respond` answers it; an exception
    of `error_type` raised there is answered in the API's shape by `_error_response` and
    counted as `rejected`. `windows` maps models to context windows (`default_window` for the
    others); `api_key` None accepts any credential; `script` answers the requests that are not
    summaries (None: the fake's own answers)."""

    known_behaviors: ClassVar[Behaviors]
    error_type: ClassVar[type[Exception]]

    def __init__(
        self,
        *counters: str,
        default_window: int,
        max_body_bytes: int,
        windows: Mapping[str, int] | None = None,
        behavior: str = "",
        stream_delay: float = 0.05,
        summarizer: Summarizer = default_summary,
        summary_delay: float = 0.0,
        script: Script | None = None,
        api_key: str | None = None,
        record: bool = True,
        port: int = 0,
    ) -> None:
        counted = ("summary_calls", "rejected", *counters)
        super().__init__(*counted, record=record, port=port, max_body_bytes=max_body_bytes)
        parse_behavior(behavior, self.known_behaviors)
        self.windows = dict(windows or {})
        self.default_window = default_window
        self.behavior = behavior
        self.stream_delay = stream_delay
        self.summarizer = summarizer
        self.summary_delay = summary_delay
        self.script = script
        self.api_key = api_key
        self._answered: list[Answered] = []

    @property
    def summary_calls(self) -> int:
        return self.counter("summary_calls")

    @property
    def rejected(self) -> int:
        """Requests answered with an API error: a 4xx or 5xx, or a stream that failed."""
        return self.counter("rejected")

    @property
    def answered(self) -> list[Answered]:
        """A snapshot of the usage of every answer to a recorded request, oldest first."""
        with self._changed:
            return list(self._answered)

    def note_usage(self, request: web.Request, usage: Mapping[str, Any]) -> None:
        """Remember the usage of an answer to `request` (when it was recorded)."""
        kept = request.get(_RECORDED)
        if kept is not None:
            with self._changed:
                self._answered.append(Answered(kept, usage))

    def window_of(self, model: str) -> int:
        return self.windows.get(model, self.default_window)

    def _forget(self) -> None:
        super()._forget()
        self._answered.clear()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raw, data, _ = await self._receive(request)
        behaviors: dict[str, str] = {}
        try:
            given = request.headers.get(BEHAVIOR_HEADER, self._behavior_of(request))
            try:
                behaviors = parse_behavior(given, self.known_behaviors)
            except ValueError as exc:
                raise self._invalid(str(exc)) from None
            response = await self._respond(request, raw, data, behaviors)
        except self.error_type as exc:
            self.bump("rejected")
            response = self._error_response(request, exc)
        except asyncio.CancelledError:
            if not self._closing:
                self.bump("cancelled")
            raise
        if not response.prepared:
            maybe_gzip(request, response, "gzip" in behaviors)
        return response

    def _behavior_of(self, request: web.Request) -> str:
        """The behaviours of a request that does not name its own."""
        return self.behavior

    async def _respond(
        self, request: web.Request, raw: bytes, data: Any, behaviors: dict[str, str]
    ) -> web.StreamResponse:
        raise NotImplementedError

    def _error_response(self, request: web.Request, error: Exception) -> web.StreamResponse:
        """An error of `error_type` as the API answers it."""
        raise NotImplementedError

    def _invalid(self, message: str) -> Exception:
        """The API's 400 for a request it cannot read."""
        raise NotImplementedError

    def _failed(self) -> Exception:
        """The API's 500."""
        raise NotImplementedError

    async def summarize(self, body: dict[str, Any]) -> str:
        """Count a summary call, wait summary_delay, ask the summarizer hook; the API's 500 when
        it fails (raises, or returns an Exception)."""
        self.bump("summary_calls")
        await asyncio.sleep(self.summary_delay)
        try:
            result = self.summarizer(body)
            if inspect.isawaitable(result):
                result = await result
        except Exception as exc:
            result = exc
        if isinstance(result, Exception):
            raise self._failed()
        return result or ""

    async def stream(
        self,
        request: web.Request,
        events: list[bytes],
        behaviors: dict[str, str],
        kind: str,
        failure: Callable[[web.StreamResponse], bytes] | None = None,
    ) -> web.StreamResponse:
        """Send events one by one, slowly (``slow-stream``), or reset (``reset-mid-stream``) or
        ended by the event `failure` gives (``error-mid-stream``) at the event asked for
        (default: the third); a single event is cut in two."""
        response = web.StreamResponse(headers={"Content-Type": kind})
        if len(events) == 1:
            response.content_length = len(events[0])
            events = [events[0][: len(events[0]) // 2], events[0][len(events[0]) // 2 :]]
        maybe_gzip(request, response, "gzip" in behaviors)
        await response.prepare(request)
        slow = behaviors.get("slow-stream")
        delay = 0.0 if slow is None else float(slow or self.stream_delay)
        cut_at, fail_at = (
            -1 if at is None else min(int(at or 2), len(events) - 1)
            for at in (behaviors.get("reset-mid-stream"), behaviors.get("error-mid-stream"))
        )
        try:
            for index, event in enumerate(events):
                if index == cut_at:
                    await asyncio.sleep(0.05)  # let the client read what was sent before the reset
                    abort(request)
                    return response
                if index == fail_at and failure is not None:
                    await response.write(failure(response))
                    break
                if index and delay:
                    await asyncio.sleep(delay)
                await response.write(event)
            await response.write_eof()
        except ConnectionResetError:  # the client went away between two events
            self.bump("cancelled")
        return response


def recorded(request: web.BaseRequest, raw: bytes, data: Any) -> RecordedRequest:
    """An HTTP request as a fake keeps it, with its body and its JSON, and its path as the
    client encoded it (which a proxy must not rewrite)."""
    path = request.raw_path.partition("?")[0]
    return RecordedRequest(request.method, path, request.query_string, request.headers, raw, data)


def abort(request: web.BaseRequest) -> None:
    """Drop the connection with a TCP reset, as a failing network does."""
    if request.transport is not None:
        sock = request.transport.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        request.transport.abort()


def maybe_gzip(request: web.BaseRequest, response: web.StreamResponse, gzip: bool) -> None:
    if gzip and "gzip" in request.headers.get("accept-encoding", ""):
        response.enable_compression(web.ContentCoding.gzip)


def serve_until_interrupted(fake: Callable[..., FakeAPI], description: str, port: int) -> None:
    """The command line of a fake: ``--port``, ``--window MODEL=TOKENS`` (repeated) and
    ``--behavior``; prints its base URL once it listens, records nothing."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--port", type=int, default=port)
    parser.add_argument("--window", action="append", default=[], metavar="MODEL=TOKENS")
    parser.add_argument("--behavior", default="")
    args = parser.parse_args()
    windows = {m: int(n) for m, _, n in (w.partition("=") for w in args.window)}
    with fake(windows=windows, behavior=args.behavior, record=False, port=args.port) as up:
        # Out of the collector's sight from now on: what start-up made, so that a full
        # collection in a benchmark's run (~13 ms at its 400 KB requests) does not stall an
        # answer and stand in the proxy's figures.
        gc.freeze()
        print(up.base_url, flush=True)
        threading.Event().wait()
