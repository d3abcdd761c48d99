"""The dashboard: a web page, served by the proxy itself at `/admin/dashboard`, of the recent
sessions and of what the proxy did to each (its turns charted, its plan in words, the text
the model sees, the decisions), live while a session runs. One file of plain HTML, CSS and
script (`dashboard.html`): no CDN, nothing to build, fine offline.

On wherever the admin API is on (`admin.dashboard.enabled`). The page holds no data; its data
endpoints (`/admin/dashboard/api/...`) take the admin token as the admin API does
(`Authorization: Bearer`), which the page asks for and keeps in the tab's `sessionStorage`.
With `admin.dashboard.open_on_loopback` and a proxy that listens on loopback only, a request
without the token is let in too, if it cannot come from another site: its `Host` names a
loopback address (a DNS rebinding attack names its own), it carries the `X-Compaction-Dashboard`
header (which a page of another origin cannot send without a CORS preflight, and the proxy
sends no CORS headers) and its `Origin`, if any, is the page's own.

It costs requests only `Sessions.observe_turn` (a turn's figures kept in the process, written
with the session at most every `write_seconds`); the store is read only while a page polls.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import logging
import re
from importlib import resources

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from proxy.config import Config
from proxy.config.checks import is_loopback
from proxy.errors import Forbidden, NotFound, Unauthorized
from proxy.server.admin import Admin, Handler, check_token, guarded
from proxy.server.session_view import session_view
from proxy.sessions.activity import ActivityLedger
from proxy.sessions.state import SessionState
from proxy.sessions.turn_log import TurnLog

log = logging.getLogger("compaction_proxy")

PATH = "/admin/dashboard"
API = f"{PATH}/api/sessions"
OWN_HEADER = "x-compaction-dashboard"
_HOST = re.compile(r"^(?:\[(?P<v6>[^\]]+)\]|(?P<name>[^:]+))(?::\d+)?$")
_NO_STORE = {"Cache-Control": "no-store"}


def dashboard_on(config: Config) -> bool:
    """Whether the dashboard is served: on, and the admin API or open access with it."""
    return config.admin.dashboard.enabled and bool(config.admin.token or open_locally(config))


def open_locally(config: Config) -> bool:
    """Open without the token: when the config says so and the proxy listens on loopback."""
    return config.admin.dashboard.open_on_loopback and is_loopback(config.listen.host)


def turn_ledger(config: Config) -> ActivityLedger | None:
    """Where the turns' figures are kept, when the dashboard is on (else they are not)."""
    if not dashboard_on(config):
        return None
    settings = config.admin.dashboard
    return ActivityLedger(settings.turns, settings.write_seconds, config.store.max_sessions)


def dashboard_routes(config: Config, admin: Admin) -> list[BaseRoute]:
    """The dashboard's page and data endpoints; none when it is off."""
    if config.admin.dashboard.open_on_loopback and not open_locally(config):
        log.warning(
            "admin.dashboard.open_on_loopback is ignored: the proxy listens beyond loopback",
            extra={"host": config.listen.host},
        )
    turns = admin.sessions.turns
    if turns is None:  # off: no turn is kept (`turn_ledger`)
        return []
    return Dashboard(config, admin, turns).routes()


class Dashboard:
    """The page and its data endpoints, the admin API's handlers for compact and reset."""

    def __init__(self, config: Config, admin: Admin, turns: TurnLog) -> None:
        self.config = config
        self.admin = admin
        self.turns = turns
        self._open = open_locally(config)

    def routes(self) -> list[BaseRoute]:
        guard = self._guard
        return [
            Route(PATH, guarded(self._check_host, self.page), methods=["GET"]),
            Route(API, guard(self.recent), methods=["GET"]),
            Route(API + "/{key}", guard(self.session), methods=["GET"]),
            Route(API + "/{key}", guard(self.admin.reset), methods=["DELETE"]),
            Route(API + "/{key}/compact", guard(self.admin.compact), methods=["POST"]),
        ]

    async def page(self, request: Request) -> Response:
        page, policy = _page()
        headers = {
            **_NO_STORE,
            "Content-Security-Policy": policy,
            "X-Frame-Options": "DENY",  # no page of another site frames the buttons
            "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "no-referrer",
        }
        return Response(page, media_type="text/html; charset=utf-8", headers=headers)

    async def recent(self, request: Request) -> Response:
        """The recent sessions, newest first; `?tenant=` only that tenant's."""
        tenant = request.query_params.get("tenant") or None
        rows = await self.turns.recent()
        return _json(
            {
                "sessions": [r.to_dict() for r in rows if tenant in (None, r.tenant)],
                "tenants": sorted({r.tenant for r in rows}),
                "write_seconds": self.config.admin.dashboard.write_seconds,
            }
        )

    async def session(self, request: Request) -> Response:
        key, version, state = await self.admin.session(request)
        activity = await self.turns.activity(key)
        if version == 0 and state == SessionState() and activity is None:
            raise NotFound("no such session")
        return _json(session_view(key, version, state, activity))

    def _guard(self, handler: Handler) -> Handler:
        return guarded(self._check, handler)

    def _check(self, request: Request) -> None:
        """The admin token, or, open locally, a request that cannot come from another site."""
        token = self.config.admin.token
        if self._open and "authorization" not in request.headers:
            self._check_local(request)
        elif token:
            check_token(request, token)
        else:
            raise Unauthorized("the dashboard is open without a token here: send none")

    def _check_local(self, request: Request) -> None:
        self._check_host(request)
        if request.headers.get(OWN_HEADER) != "1":
            raise Forbidden(f"the dashboard's own requests carry {OWN_HEADER}: 1")
        origin = request.headers.get("origin")
        host = request.headers.get("host", "")
        if origin is not None and origin not in (f"http://{host}", f"https://{host}"):
            raise Forbidden("a request from another site")

    def _check_host(self, request: Request) -> None:
        """Open locally, a request must name a loopback host: a DNS rebinding attack's
        requests name the attacker's."""
        if not self._open:
            return
        match = _HOST.match(request.headers.get("host", ""))
        name = match and (match["v6"] or match["name"])
        if not name or not is_loopback(name):
            raise Forbidden("the dashboard answers only requests to a loopback address")


def _json(body: object) -> Response:
    return Response(orjson.dumps(body), media_type="application/json", headers=_NO_STORE)


@functools.cache
def _page() -> tuple[bytes, str]:
    """The page, and a Content-Security-Policy that lets in its own script and style only."""
    page = resources.files("proxy.server").joinpath("dashboard.html").read_bytes()
    hashes = {}
    for tag in ("script", "style"):
        found = re.search(rb"<%s>(.*?)</%s>" % (tag.encode(), tag.encode()), page, re.S)
        assert found is not None, f"dashboard.html has its {tag}"
        digest = base64.b64encode(hashlib.sha256(found[1]).digest()).decode()
        hashes[tag] = f"'sha256-{digest}'"
    policy = (
        f"default-src 'none'; script-src {hashes['script']}; style-src {hashes['style']}; "
        "connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; "
        "frame-ancestors 'none'"
    )
    return page, policy
