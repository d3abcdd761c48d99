"""The kept originals over HTTP: to an operator through the admin API
(`GET /admin/sessions/{key}/originals/{handle}`, the admin token), and to the client itself
(`GET /v1/compaction/originals/{handle}` with its own credential and its session header: only
its own tenant's session is ever read). The original as it was kept, as text."""

from __future__ import annotations

import re

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from proxy.compaction.kept_originals import KeptOriginals
from proxy.config import Config
from proxy.errors import InvalidRequest, NotFound
from proxy.server.admin import check_token, guarded, path_key
from proxy.server.tenants import Tenants
from proxy.sessions.sessions import session_key

CLIENT_PATH = "/v1/compaction/originals/{handle}"
_HANDLE = re.compile(r"o[0-9a-f]{16}")


class OriginalsAPI:
    def __init__(self, kept: KeptOriginals, tenants: Tenants, config: Config) -> None:
        self.kept = kept
        self.tenants = tenants
        self.session_header = config.sessions.header
        self.token = config.admin.token

    def routes(self) -> list[BaseRoute]:
        """The client's route, and the admin API's when it is on."""
        found: list[BaseRoute] = [Route(CLIENT_PATH, guarded(_none, self.own), methods=["GET"])]
        token = self.token
        if token:
            check = guarded(lambda request: check_token(request, token), self.admin)
            path = "/admin/sessions/{key}/originals/{handle}"
            found.append(Route(path, check, methods=["GET"]))
        return found

    async def own(self, request: Request) -> Response:
        tenant = self.tenants.tenant(request.headers)
        session = request.headers.get(self.session_header)
        if not session:
            raise InvalidRequest(f"name the session in the {self.session_header} header")
        return await self._read(session_key(tenant, session), request)

    async def admin(self, request: Request) -> Response:
        return await self._read(path_key(request), request)

    async def _read(self, key: str, request: Request) -> Response:
        handle = request.path_params["handle"]
        if not isinstance(handle, str) or not _HANDLE.fullmatch(handle):
            raise InvalidRequest("a handle is 'o' and 16 lowercase hex characters")
        data = await self.kept.read(key, handle)
        if data is None:
            raise NotFound("no output is kept under this handle in this session")
        return Response(data, media_type="text/plain; charset=utf-8")


def _none(_request: Request) -> None:
    """No check of its own: the route reads only the caller's own tenant's session."""
