"""The floor the proxy is measured against: a bare Starlette relay of chat completions and
Responses with an aiohttp client and no session, token or compaction work, served as the proxy
is (uvicorn, uvloop, httptools).

    .venv/bin/python bench/relay.py --port 8090 --upstream http://127.0.0.1:8001/v1
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import AsyncIterator

import aiohttp
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

_SKIP = frozenset({"host", "content-length", "connection", "transfer-encoding", "keep-alive"})


def relay_app(upstream: str) -> Starlette:
    session: aiohttp.ClientSession | None = None

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        nonlocal session
        session = aiohttp.ClientSession(
            auto_decompress=False, skip_auto_headers=("User-Agent", "Accept-Encoding", "Accept")
        )
        yield
        await session.close()

    async def relay(request: Request) -> Response:
        assert session is not None
        headers = [(k, v) for k, v in request.headers.items() if k not in _SKIP]
        path = request.url.path.removeprefix("/v1")
        response = await session.post(
            f"{upstream}{path}", data=await request.body(), headers=headers
        )
        relayed = {k: v for k, v in response.headers.items() if k.lower() not in _SKIP}
        if not response.content_type.startswith("text/event-stream"):
            async with response:
                return Response(await response.read(), response.status, relayed)

        async def body() -> AsyncIterator[bytes]:
            try:
                while chunk := await response.content.readany():
                    yield chunk
            finally:
                response.release()

        return StreamingResponse(body(), status_code=response.status, headers=relayed)

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    routes = [
        Route("/v1/chat/completions", relay, methods=["POST"]),
        Route("/v1/responses", relay, methods=["POST"]),
        Route("/healthz", healthz, methods=["GET"]),
    ]
    return Starlette(routes=routes, lifespan=lifespan)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="the upstream's base URL, with /v1")
    args = parser.parse_args()
    app = relay_app(args.upstream.rstrip("/"))
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
