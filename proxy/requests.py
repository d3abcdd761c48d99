"""Reading what the client sent, before any wire format looks at it."""

from __future__ import annotations

from starlette.requests import Request

from .errors import BodyTooLarge


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refused with 413 as soon as it is known to exceed `limit`."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(_too_large(limit))
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(_too_large(limit))
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large(limit: int) -> str:
    return f"request body is larger than this proxy accepts ({limit} bytes)"


def query_string(request: Request) -> str:
    """The raw query string (without building a URL object on the hot path)."""
    query: bytes = request.scope.get("query_string", b"")
    return query.decode("latin-1")
