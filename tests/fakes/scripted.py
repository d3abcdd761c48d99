"""Scripted upstreams: an HTTP/1.1 server on loopback (`asyncio.start_server`) whose every
answer a test writes itself, byte by byte, for what the strict fakes cannot do exactly enough:
set a cookie, close a kept-alive connection as the next request comes in, stream without end.

    async def script(request: Request, writer: asyncio.StreamWriter) -> bool:
        writer.write(response(200, b"{}"))
        return True  # keep the connection for the next request

    with ScriptedUpstream(script) as up:
        ...  # up.base_url, up.requests, up.connections, up.closed
"""

from __future__ import annotations

import asyncio
import dataclasses
import socket
from collections.abc import Awaitable, Callable, Iterable

from tests.fakes.base import FakeServer


@dataclasses.dataclass(frozen=True)
class Request:
    method: str
    path: str
    headers: dict[str, str]  # names in lower case
    body: bytes
    connection: int  # the number of the connection it came on, from 1
    number: int  # its number on that connection, from 1


Script = Callable[[Request, asyncio.StreamWriter], Awaitable[bool]]


def response(
    status: int,
    body: bytes = b"{}",
    headers: Iterable[tuple[str, str]] = (),
    content_type: str = "application/json",
) -> bytes:
    """A whole HTTP/1.1 response, framed by Content-Length."""
    lines = [f"HTTP/1.1 {status} Scripted", f"Content-Type: {content_type}"]
    lines += [f"{name}: {value}" for name, value in headers]
    lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def stream_head(status: int = 200) -> bytes:
    """The head of a chunked event stream; `chunk` frames what follows."""
    return (
        f"HTTP/1.1 {status} Scripted\r\nContent-Type: text/event-stream\r\n"
        "Transfer-Encoding: chunked\r\n\r\n"
    ).encode()


def chunk(data: bytes) -> bytes:
    """One chunk of a chunked body (an empty one ends it)."""
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def event(data: str) -> bytes:
    return chunk(f"data: {data}\n\n".encode())


class ScriptedUpstream(FakeServer[Request]):
    """Serves `script` on 127.0.0.1 from a thread of its own; `host` names it in `base_url`
    (`localhost` for a hostname rather than an IP literal)."""

    def __init__(self, script: Script, host: str = "127.0.0.1") -> None:
        super().__init__()
        self.script = script
        self.host = host
        self.connections = 0  # accepted so far
        self.open = 0  # open now
        self.most_open = 0  # open at once, at most
        self.closed = 0  # connections over, whichever side closed them
        self._server: asyncio.Server | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    async def _serve(self, sock: socket.socket) -> None:
        self._server = await asyncio.start_server(self._connection, sock=sock)

    async def _shut(self) -> None:
        assert self._server is not None
        self._server.close()
        for task in asyncio.all_tasks() - {asyncio.current_task()}:
            task.cancel()

    def _note(self, **changes: int) -> None:
        with self._changed:
            for name, change in changes.items():
                setattr(self, name, getattr(self, name) + change)
            self.most_open = max(self.most_open, self.open)
            self._changed.notify_all()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._note(connections=1, open=1)
        connection = self.connections
        try:
            for number in range(1, 1_000_000):
                request = await _read_request(reader, connection, number)
                if request is None:
                    return
                self._record(request)
                keep = await self.script(request, writer)
                await writer.drain()
                if not keep:
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        except asyncio.CancelledError:
            return  # the server stops: a quiet end, not an error to log
        finally:
            writer.close()
            self._note(open=-1, closed=1)


async def _read_request(
    reader: asyncio.StreamReader, connection: int, number: int
) -> Request | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None  # the client closed the connection between requests
    first, *lines = head.decode("latin-1").split("\r\n")
    method, path, _ = first.split(" ", 2)
    headers = {}
    for line in lines:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return Request(method, path, headers, body, connection, number)
