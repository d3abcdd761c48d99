"""Reading what the client sent, before any wire format looks at it."""

from __future__ import annotations

from typing import Any

from starlette.datastructures import Headers
from starlette.requests import ClientDisconnect, Request

from proxy.errors import BodyTooLarge, InvalidRequest, NotFound


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
    """The request body, refused with 413 as soon as it is known to exceed `limit`."""
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
