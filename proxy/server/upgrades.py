"""WebSocket upgrades, refused: the proxy speaks HTTP only."""

from __future__ import annotations

from starlette.websockets import WebSocket


async def refuse_websocket(websocket: WebSocket) -> None:
    """The proxy speaks HTTP only: a WebSocket upgrade (Codex CLI tries one on /v1/responses
    first) is refused at once, with a 403, and the client falls back to HTTP."""
    await websocket.close()
