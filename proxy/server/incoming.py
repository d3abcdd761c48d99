"""Reading what the client sent, before any wire format looks at it.

A body sent compressed (`Content-Encoding: gzip` or `deflate`, which Anthropic's and OpenAI's
APIs accept) is decoded, and bounded once decoded; it goes upstream decoded (the proxy reads
and rewrites it), without the header. Any other coding is a 415 that names it.
"""

from __future__ import annotations

import zlib
from typing import Any

from starlette.datastructures import Headers
from starlette.requests import ClientDisconnect, Request

from proxy.errors import BodyTooLarge, InvalidRequest, NotFound, UnsupportedMediaType

CODINGS = frozenset({"gzip", "x-gzip", "deflate"})
_AUTO_HEADER = zlib.MAX_WBITS | 32  # a gzip or a zlib header, whichever the body has


class RequestHeaders(Headers):
    """A request's headers decoded once: starlette's decode them all at every `items()` and
    scan them at every look-up, and a request path looks up a dozen."""

    def __init__(self, raw: list[tuple[bytes, bytes]]) -> None:
        super().__init__(raw=raw)
        self._items = [(name.decode("latin-1"), value.decode("latin-1")) for name, value in raw]
        self._first = {name.lower(): value for name, value in reversed(self._items)}

    def items(self) -> list[tuple[str, str]]:  # type: ignore[override]
        return self._items

    def get(self, key: str, default: Any = None) -> Any:
        return self._first.get(key.lower(), default)

    def __getitem__(self, key: str) -> str:
        return self._first[key.lower()]

    def __contains__(self, key: Any) -> bool:
        return isinstance(key, str) and key.lower() in self._first


class IncomingRequest(Request):
    """A client's request, its headers decoded once (`RequestHeaders`)."""

    @property
    def headers(self) -> Headers:
        if not hasattr(self, "_headers"):
            self._headers = RequestHeaders(self.scope["headers"])
        return self._headers


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, decoded, refused with 413 as soon as it is known to exceed `limit`
    (sent, or decoded)."""
    raw = await read_sent(request, limit)
    coding = request.headers.get("content-encoding")
    return raw if coding is None or not raw else decoded(raw, coding, limit)


def decoded(raw: bytes, coding: str, limit: int) -> bytes:
    """`raw` as sent with `Content-Encoding: coding`, decoded: a 413 past `limit` bytes (a
    small body can decompress to gigabytes), a 400 when it is not what the coding says."""
    codings = [
        c for c in (c.strip().lower() for c in coding.split(",")) if c not in ("", "identity")
    ]
    if not codings:
        return raw
    if len(codings) > 1 or codings[0] not in CODINGS:
        raise UnsupportedMediaType(
            f"Content-Encoding '{coding}' is not supported: send the body uncompressed, or"
            " compressed with gzip or deflate."
        )
    decompressor = zlib.decompressobj(_AUTO_HEADER)
    try:
        body = decompressor.decompress(raw, limit + 1)
    except zlib.error:
        body = b""  # and not at its end: refused below
    if len(body) > limit:
        raise BodyTooLarge(_too_large(limit) + " once decompressed")
    if not decompressor.eof or decompressor.unused_data:
        raise InvalidRequest(f"The request body is not valid {codings[0]} data.")
    return body


async def read_sent(request: Request, limit: int) -> bytes:
    """The request body as sent (what a call relayed untouched forwards), refused with 413 as
    soon as it is known to exceed `limit`."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(_too_large(limit))
    # Read from the server as it comes (starlette's `stream()` is a generator around this).
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect
        chunk: bytes = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(_too_large(limit))
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _too_large(limit: int) -> str:
    return f"request body is larger than this proxy accepts ({limit} bytes)"


def query_string(request: Request) -> str:
    """The raw query string (without building a URL object on the hot path)."""
    query: bytes = request.scope.get("query_string", b"")
    return query.decode("latin-1")


def check_path(request: Request) -> None:
    """Refuses a path that could lead out of the upstream's base URL, decoded or not: dot
    segments (404: nothing is there), and `\\` or `;` (400: some servers read the one as `/`
    and cut a segment at the other, so that `..;` or `..\\` would go up a level)."""
    path: str = request.scope["path"]
    if any(segment in (".", "..") for segment in path.split("/")):
        raise NotFound(f"Invalid URL ({request.method} {path})")
    if "\\" in path or ";" in path:
        raise InvalidRequest(f"Invalid URL ({request.method} {path}): no \\ or ; in a path")
