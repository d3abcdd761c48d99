"""The admin API: inspect, reset and compact sessions. Off unless `admin.token` is set.

Sessions are addressed by their key (the `x-compaction-session` response header, a hash of
tenant and session id), or by tenant and session id through `/admin/session-key`.
The proxy keeps no conversation history, only plans: a manual compaction is therefore
carried out on the session's next request, with the instructions given here.
"""

from __future__ import annotations

import dataclasses
import hmac
import re
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from proxy.compaction.summarizer import MAX_INSTRUCTIONS
from proxy.credentials import bearer
from proxy.dialects.openai.chat import Chat
from proxy.errors import APIError, InvalidRequest, NotFound, Unauthorized
from proxy.sessions.sessions import Sessions, session_key

_KEY = re.compile(r"^[0-9a-f]{32}$")


class Admin:
    def __init__(self, token: str, sessions: Sessions) -> None:
        self._token = token.encode()
        self.sessions = sessions  # failing closed: an operator wants to see a failure

    def routes(self) -> list[BaseRoute]:
        return [
            Route("/admin/session-key", self._guard(self.key), methods=["GET"]),
            Route("/admin/sessions/{key}", self._guard(self.inspect), methods=["GET"]),
            Route("/admin/sessions/{key}", self._guard(self.reset), methods=["DELETE"]),
            Route("/admin/sessions/{key}/compact", self._guard(self.compact), methods=["POST"]),
        ]

    def _guard(self, handler: Any) -> Any:
        async def endpoint(request: Request) -> Response:
            try:
                presented = bearer(request.headers.get("authorization", "")).encode()
                if not hmac.compare_digest(presented, self._token):
                    raise Unauthorized("invalid admin token")
                response: Response = await handler(request)
                return response
            except APIError as exc:
                return Chat().error_response(exc)

        return endpoint

    async def key(self, request: Request) -> Response:
        tenant = request.query_params.get("tenant")
        session = request.query_params.get("session")
        if not tenant or not session:
            raise InvalidRequest("give both 'tenant' and 'session' query parameters")
        return JSONResponse({"key": session_key(tenant, session)})

    async def inspect(self, request: Request) -> Response:
        key = _key(request)
        loaded = await self.sessions.load(key)
        # What the upstream's prompt cache did, as this process read it, is written with
        # the session's next write: shown here already.
        state = self.sessions.with_unwritten(key, loaded.state)
        if loaded.version == 0 and state.prompt_cache is None:
            raise NotFound("no such session")
        body = {"key": key, "version": loaded.version, **state.to_dict()}
        data = orjson.dumps(body, option=orjson.OPT_NON_STR_KEYS)
        return Response(data, media_type="application/json")

    async def reset(self, request: Request) -> Response:
        await self.sessions.delete(_key(request))
        return Response(status_code=204)

    async def compact(self, request: Request) -> Response:
        key = _key(request)
        instructions = ""
        raw = await request.body()
        if raw:
            try:
                data = orjson.loads(raw)
            except orjson.JSONDecodeError:
                raise InvalidRequest('the body must be JSON: {"instructions": "..."}') from None
            value = data.get("instructions", "") if isinstance(data, dict) else None
            if not isinstance(value, str) or len(value) > MAX_INSTRUCTIONS:
                raise InvalidRequest(
                    f"'instructions' must be a string of at most {MAX_INSTRUCTIONS} characters"
                )
            instructions = value
        if not await self.sessions.update(
            key, lambda state: dataclasses.replace(state, pending=instructions)
        ):
            raise InvalidRequest("the session is changing too fast; try again")
        return JSONResponse({"key": key, "status": "compaction on the next request"}, 202)


def _key(request: Request) -> str:
    key = request.path_params["key"]
    if not isinstance(key, str) or not _KEY.match(key):
        raise InvalidRequest("a session key is 32 lowercase hex characters")
    return key
