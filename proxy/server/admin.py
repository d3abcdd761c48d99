"""The admin API: inspect, reset and compact sessions. Off unless `admin.token` is set. The
dashboard (`dashboard`) serves its handlers behind checks of its own.

Sessions are addressed by their key (the `x-compaction-session` response header, a hash of
tenant and session id), or by tenant and session id through `/admin/session-key`.
The proxy keeps no conversation history, only plans: a manual compaction is therefore
carried out on the session's next request, with the instructions given here.
"""

from __future__ import annotations

import dataclasses
import hmac
import re
from collections.abc import Awaitable, Callable

import orjson
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from proxy.compaction.summarizer import MAX_INSTRUCTIONS
from proxy.credentials import bearer
from proxy.dialects.openai.chat import Chat
from proxy.errors import APIError, InvalidRequest, NotFound, Unauthorized
from proxy.sessions.sessions import Sessions, session_key
from proxy.sessions.state import SessionState

_KEY = re.compile(r"^[0-9a-f]{32}$")
OFF = (
    "The admin API is off: set admin.token in the config to turn it on (the default"
    " config.yaml reads it from $COMPACTION_PROXY_ADMIN_TOKEN)."
)


Handler = Callable[[Request], Awaitable[Response]]


class Admin:
    def __init__(self, sessions: Sessions) -> None:
        self.sessions = sessions  # failing closed: an operator wants to see a failure

    def routes(self, token: str | None) -> list[BaseRoute]:
        """The admin API's routes, for requests bearing `token`; none without a token."""
        if not token:
            return []

        def guard(handler: Handler) -> Handler:
            return guarded(lambda request: check_token(request, token), handler)

        return [
            Route("/admin/session-key", guard(self.key), methods=["GET"]),
            Route("/admin/sessions/{key}", guard(self.inspect), methods=["GET"]),
            Route("/admin/sessions/{key}", guard(self.reset), methods=["DELETE"]),
            Route("/admin/sessions/{key}/compact", guard(self.compact), methods=["POST"]),
        ]

    async def key(self, request: Request) -> Response:
        tenant = request.query_params.get("tenant")
        session = request.query_params.get("session")
        if not tenant or not session:
            raise InvalidRequest("give both 'tenant' and 'session' query parameters")
        return JSONResponse({"key": session_key(tenant, session)})

    async def session(self, request: Request) -> tuple[str, int, SessionState]:
        """The key, version and state of the session the request's path names (version 0 and
        an empty state when there is none). What the upstream's prompt cache did, as this
        process read it, is written with the session's next write: shown here already."""
        key = path_key(request)
        loaded = await self.sessions.load(key)
        return key, loaded.version, self.sessions.with_unwritten(key, loaded.state)

    async def inspect(self, request: Request) -> Response:
        key, version, state = await self.session(request)
        if version == 0 and state.prompt_cache is None:
            raise NotFound("no such session")
        body = {"key": key, "version": version, **state.to_dict()}
        data = orjson.dumps(body, option=orjson.OPT_NON_STR_KEYS)
        return Response(data, media_type="application/json")

    async def reset(self, request: Request) -> Response:
        await self.sessions.delete(path_key(request))
        return Response(status_code=204)

    async def compact(self, request: Request) -> Response:
        key = path_key(request)
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


async def admin_off(request: Request) -> Response:
    """Any /admin/ path while the admin API is off (no `admin.token`): a 404 that says so."""
    raise NotFound(f"{OFF} ({request.method} {request.url.path})")


def guarded(check: Callable[[Request], None], handler: Handler) -> Handler:
    """`handler` once `check` let the request through (it raises an APIError when not); its
    errors in OpenAI's shape."""

    async def endpoint(request: Request) -> Response:
        try:
            check(request)
            return await handler(request)
        except APIError as exc:
            return Chat().error_response(exc)

    return endpoint


def check_token(request: Request, token: str) -> None:
    """Unauthorized unless the request bears the admin token (compared in constant time)."""
    presented = bearer(request.headers.get("authorization", "")).encode()
    if not hmac.compare_digest(presented, token.encode()):
        raise Unauthorized("invalid admin token")


def path_key(request: Request) -> str:
    key = request.path_params["key"]
    if not isinstance(key, str) or not _KEY.match(key):
        raise InvalidRequest("a session key is 32 lowercase hex characters")
    return key
