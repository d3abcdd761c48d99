"""The fake server: one aiohttp app on 127.0.0.1 serving both APIs from a background thread."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import struct
from typing import Any, Unpack

import orjson
from aiohttp import web

from tests.fakes.base import FakeAPI, Settings
from tests.fakes.openai import chat, responses
from tests.fakes.openai.common import (
    BEHAVIORS,
    PARSE_ERROR,
    SERVER_ERROR,
    ApiError,
    bad,
    count_text,
    dumps,
    missing,
)
from tests.fakes.openai.responses_input import Memory

_STATUS_ERRORS: dict[int, tuple[str, str, str | None]] = {
    401: ("Incorrect API key provided.", "invalid_request_error", "invalid_api_key"),
    429: ("Rate limit reached for requests.", "requests", "rate_limit_exceeded"),
    500: (SERVER_ERROR, "server_error", None),
    503: ("The engine is currently overloaded, please try again later.", "server_error", None),
}
_NO_KEY = (
    "You didn't provide an API key. You need to provide your API key in an Authorization header"
    " using Bearer auth (i.e. Authorization: Bearer YOUR_KEY), or as the basic auth username and"
    " password if you're accessing the API from your browser. You can obtain an API key from"
    " https://platform.openai.com/account/api-keys."
)


def _embeddings(body: Any) -> dict[str, Any]:
    """Deterministic unit-range vectors, one for each input, float or base64 as asked."""
    if not isinstance(body, dict):
        raise bad(PARSE_ERROR)
    if not body.get("model"):
        raise bad("you must provide a model parameter")
    if "input" not in body:
        raise missing("input")
    given = body["input"]
    single = not isinstance(given, list) or not given or isinstance(given[0], int)
    items = [given] if single else given
    size = int(body.get("dimensions") or 8)
    data = []
    for index, item in enumerate(items):
        raw = hashlib.shake_128(orjson.dumps(item)).digest(2 * size)
        vector = [v / 32768 - 1 for v in struct.unpack(f"<{size}H", raw)]  # exact in float32
        encoded = base64.b64encode(struct.pack(f"<{size}f", *vector)).decode()
        embedding = encoded if body.get("encoding_format") == "base64" else vector
        data.append({"object": "embedding", "index": index, "embedding": embedding})
    tokens = sum(count_text(x, "cl100k_base") if isinstance(x, str) else len(x) for x in items)
    usage = {"prompt_tokens": tokens, "total_tokens": tokens}
    return {"object": "list", "data": data, "model": body["model"], "usage": usage}


class FakeUpstream(FakeAPI):
    """The fake API on 127.0.0.1, served from a background thread with its own event loop."""

    api_path = "/v1"
    known_behaviors = BEHAVIORS
    error_type = ApiError

    def __init__(
        self,
        *,
        default_window: int = 128_000,
        provider_compaction: bool = True,
        chat_only: bool = False,
        signing_key: bytes | None = None,
        **settings: Unpack[Settings],
    ) -> None:
        super().__init__(
            "compact_calls", default_window=default_window, max_body_bytes=100 * 2**20, **settings
        )
        # False: a server without provider compaction (a local one): no /v1/responses/compact,
        # and compaction and compaction_trigger items are types it does not know.
        self.provider_compaction = provider_compaction
        # True: an OpenAI-compatible server with chat completions only (many local ones): the
        # Responses API's paths are not found.
        self.chat_only = chat_only
        # What the Responses API remembers between requests; `signing_key` lets two fakes accept
        # each other's encrypted content.
        self.memory = Memory(signing_key)

    @property
    def compact_calls(self) -> int:
        """Provider compactions: calls of ``POST /v1/responses/compact`` and requests ending with
        a ``compaction_trigger``."""
        return self.counter("compact_calls")

    def reset(self) -> None:
        """Forget the requests, zero the counters and empty the prompt cache (settings are kept,
        and so are stored responses and the items the Responses API produced)."""
        with self._changed:
            self._forget()
            self.memory.cache.clear()

    async def _prepare(self, request: web.Request, response: web.StreamResponse) -> None:
        response.headers["x-request-id"] = "req_" + os.urandom(12).hex()

    def _error_response(self, request: web.Request, error: Exception) -> web.StreamResponse:
        assert isinstance(error, ApiError)
        return web.json_response(error.body, status=error.status, dumps=dumps)

    def _invalid(self, message: str) -> Exception:
        return bad(message)

    def _failed(self) -> Exception:
        return ApiError(500, SERVER_ERROR, kind="server_error")

    def _check_auth(self, request: web.Request) -> None:
        if self.api_key is None or not request.path.startswith("/v1/"):
            return
        given = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
        if not given:
            raise ApiError(401, _NO_KEY)
        if given != self.api_key:
            masked = given[:3] + "*" * max(len(given) - 7, 0) + given[-4:]
            where = "You can find your API key at https://platform.openai.com/account/api-keys."
            message = f"Incorrect API key provided: {masked}. {where}"
            raise ApiError(401, message, code="invalid_api_key")

    async def _respond(
        self, request: web.Request, raw: bytes, data: Any, behaviors: dict[str, str]
    ) -> web.StreamResponse:
        method, path = request.method, request.path
        if path == "/elsewhere":  # where "redirect" points: a proxy that follows lands here
            return web.json_response({"followed": "redirect"})
        self._check_auth(request)
        if "hang" in behaviors:
            await asyncio.Event().wait()
        if "redirect" in behaviors:
            return web.Response(status=302, headers={"Location": f"{self.origin}/elsewhere"})
        if "status" in behaviors:
            status = int(behaviors["status"])
            kind = "server_error" if status >= 500 else "invalid_request_error"
            message, kind, code = _STATUS_ERRORS.get(status, (f"Fake error {status}.", kind, None))
            raise ApiError(status, message, code=code, kind=kind)
        if (method, path) == ("POST", "/v1/chat/completions"):
            return await chat.handle(self, request, raw, data, behaviors)
        if self.chat_only and path.startswith("/v1/responses"):
            raise ApiError(404, f"Invalid URL ({method} {path})")
        if (method, path) == ("POST", "/v1/responses"):
            return await responses.handle(self, request, raw, data, behaviors)
        if (method, path) == ("POST", "/v1/responses/compact") and self.provider_compaction:
            return await responses.compact(self, request, data, behaviors)
        if (method, path) == ("POST", "/v1/embeddings"):
            return web.json_response(_embeddings(data), dumps=dumps)
        if (method, path) == ("GET", "/v1/models"):
            models = [
                {"id": m, "object": "model", "created": 1700000000, "owned_by": "system"}
                for m in self.windows
            ]
            return web.json_response({"object": "list", "data": models})
        raise ApiError(404, f"Invalid URL ({method} {path})")
