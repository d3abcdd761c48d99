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
import ssl
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path

from tests.fakes.base import FakeServer, Recorded

# A self-signed certificate for localhost and 127.0.0.1: a client trusts it when its
# SSL_CERT_FILE is TLS / "cert.pem".
TLS = Path(__file__).parent.parent / "data" / "tls"


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


def server_tls() -> ssl.SSLContext:
    """A server's TLS settings, with the certificate of `TLS`."""
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(TLS / "cert.pem", TLS / "key.pem")
    return tls


class LoopbackServer(FakeServer[Recorded]):
    """A fake of raw connections (over TLS with `tls`), each served by `_connection`; `host`
    names it in `origin` (`localhost` for a hostname rather than an IP literal)."""

    def __init__(self, tls: ssl.SSLContext | None = None, host: str = "127.0.0.1") -> None:
        super().__init__()
        self.tls = tls
        self.host = host
        self._server: asyncio.Server | None = None

    @property
    def origin(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}"

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raise NotImplementedError

    async def _serve(self, sock: socket.socket) -> None:
        self._server = await asyncio.start_server(self._connection, sock=sock, ssl=self.tls)

    async def _shut(self) -> None:
        assert self._server is not None
        self._server.close()
        serving = asyncio.all_tasks() - {asyncio.current_task()}
        for task in serving:
            task.cancel()
        await asyncio.gather(*serving, return_exceptions=True)  # their connections closed


class ScriptedUpstream(LoopbackServer[Request]):
    """Serves `script`, its API at `base_url`."""

    api_path = "/v1"

    def __init__(
        self, script: Script, host: str = "127.0.0.1", tls: ssl.SSLContext | None = None
    ) -> None:
        super().__init__(tls, host)
        self.script = script
        self.connections = 0  # accepted so far
        self.open = 0  # open now
        self.most_open = 0  # open at once, at most
        self.closed = 0  # connections over, whichever side closed them

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


async def read_head(reader: asyncio.StreamReader) -> tuple[str, str, dict[str, str]] | None:
    """A request's method, target and headers (names in lower case); None when the client
    closed the connection between requests."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    first, *lines = head.decode("latin-1").split("\r\n")
    method, target, _ = first.split(" ", 2)
    headers = {}
    for line in lines:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    return method, target, headers


async def _read_request(
    reader: asyncio.StreamReader, connection: int, number: int
) -> Request | None:
    head = await read_head(reader)
    if head is None:
        return None
    method, path, headers = head
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return Request(method, path, headers, body, connection, number)
