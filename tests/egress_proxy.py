"""An egress proxy on loopback, as a corporate network puts in front of the internet: CONNECT
tunnels (for https) and requests in absolute form (for plain HTTP), each recorded, from a
thread of its own. It may ask for credentials, refuse everything with a status, or be reached
over TLS itself (an https:// proxy).

    with EgressProxy(credentials=("user", "secret")) as egress:
        ...  # egress.url, egress.seen
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import ssl
from urllib.parse import urlsplit

from tests.fakes.scripted import LoopbackServer, read_head


@dataclasses.dataclass(frozen=True)
class Seen:
    method: str
    target: str  # `host:port` for CONNECT, the absolute URL otherwise
    headers: dict[str, str]  # names in lower case


class EgressProxy(LoopbackServer[Seen]):
    def __init__(
        self,
        credentials: tuple[str, str] | None = None,
        refuse: int = 0,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        super().__init__(tls)
        self.credentials = credentials
        self.refuse = refuse  # a status to answer everything with (0: none)

    @property
    def url(self) -> str:
        """Its URL, without credentials."""
        return self.origin

    @property
    def seen(self) -> list[Seen]:
        """The request heads received, in order."""
        return self.requests

    def connects(self) -> list[str]:
        """The targets of the tunnels asked for, in order."""
        return [seen.target for seen in self.seen if seen.method == "CONNECT"]

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            seen = await _read_head(reader)
            if seen is None:
                return
            self._record(seen)
            refusal = self._refusal(seen)
            if refusal:
                writer.write(b"HTTP/1.1 %d Refused\r\nContent-Length: 0\r\n\r\n" % refusal)
                await writer.drain()
            elif seen.method == "CONNECT":
                host, _, port = seen.target.rpartition(":")
                upstream = await asyncio.open_connection(host.strip("[]"), int(port))
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
                await _pipe_both(reader, writer, *upstream)
            else:
                await self._forward(seen, reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    def _refusal(self, seen: Seen) -> int:
        if self.refuse:
            return self.refuse
        if self.credentials is None:
            return 0
        expected = "Basic " + base64.b64encode(":".join(self.credentials).encode()).decode()
        return 0 if seen.headers.get("proxy-authorization") == expected else 407

    async def _forward(
        self, seen: Seen, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """Requests in absolute form, one after another, to the server the first names; its
        answers go back as they come."""
        url = urlsplit(seen.target)
        upstream_reader, upstream = await asyncio.open_connection(url.hostname, url.port)
        answers = asyncio.create_task(_pipe(upstream_reader, writer))
        try:
            request: Seen | None = seen
            while request is not None:
                parts = urlsplit(request.target)
                path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
                lines = [f"{request.method} {path} HTTP/1.1"]
                lines += [f"{n}: {v}" for n, v in request.headers.items() if n[:6] != "proxy-"]
                upstream.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
                upstream.write(
                    await reader.readexactly(int(request.headers.get("content-length", 0)))
                )
                request = await _read_head(reader)
                if request is not None:
                    self._record(request)
        finally:  # the client hung up, having had its answers
            answers.cancel()
            upstream.close()


async def _read_head(reader: asyncio.StreamReader) -> Seen | None:
    head = await read_head(reader)
    return None if head is None else Seen(*head)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()


async def _pipe_both(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    upstream_reader: asyncio.StreamReader,
    upstream: asyncio.StreamWriter,
) -> None:
    await asyncio.gather(_pipe(reader, upstream), _pipe(upstream_reader, writer))
