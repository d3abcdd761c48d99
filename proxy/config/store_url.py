"""The session store's URL, read by one parser: the config check and `proxy.store.open_store`
judge a URL the same way, once at start-up.

    memory://                                                    one process
    redis://[user:password@]host[:port][/db]                     one Redis server
    redis+cluster://[user:password@]host:port[,host:port...]     Redis Cluster (seed nodes)
    redis+sentinel://[user:password@]host:port[,host:port...]/master-name[/db]

`rediss` instead of `redis` (`rediss://`, `rediss+cluster://`, `rediss+sentinel://`) speaks
TLS to every server, Sentinels included. The query string takes the TLS options
`ssl_ca_certs`, `ssl_certfile`, `ssl_keyfile`, `ssl_cert_reqs` and `ssl_check_hostname`, and
for Sentinel `sentinel_auth` (the Sentinels require the same user and password).

Errors never quote the URL, nor any part of it: it may hold a password.
"""

from __future__ import annotations

import dataclasses
import re
import typing
from typing import Any, Literal
from urllib.parse import parse_qsl, unquote, urlsplit

from proxy.errors import ProxyError

Kind = Literal["memory", "redis", "cluster", "sentinel"]
CertReqs = Literal["required", "optional", "none"]

SCHEMES: dict[str, tuple[Kind, bool]] = {
    "memory": ("memory", False),
    "redis": ("redis", False),
    "rediss": ("redis", True),
    "redis+cluster": ("cluster", False),
    "rediss+cluster": ("cluster", True),
    "redis+sentinel": ("sentinel", False),
    "rediss+sentinel": ("sentinel", True),
}
DEFAULT_PORT = {"redis": 6379, "cluster": 6379, "sentinel": 26379}
TLS_OPTIONS = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_cert_reqs", "ssl_check_hostname")

_HOST = re.compile(r"[A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]+\]")
_DB = re.compile(r"/?|/[0-9]{1,5}")
_BOOLEANS = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}


class InvalidStoreURL(ProxyError, ValueError):
    """`store.url` names no store the proxy can open; `problem` says why, without the URL."""

    def __init__(self, problem: str) -> None:
        super().__init__(f"store.url: {problem}")
        self.problem = problem


@dataclasses.dataclass(frozen=True)
class TLS:
    """How to check the servers' certificates (and present the client's own)."""

    ca_certs: str | None = None
    certfile: str | None = None
    keyfile: str | None = None
    cert_reqs: CertReqs = "required"
    check_hostname: bool = True

    def options(self) -> dict[str, Any]:
        """redis-py's connection options."""
        return {
            "ssl": True,
            "ssl_ca_certs": self.ca_certs,
            "ssl_certfile": self.certfile,
            "ssl_keyfile": self.keyfile,
            "ssl_cert_reqs": self.cert_reqs,
            "ssl_check_hostname": self.check_hostname,
        }


@dataclasses.dataclass(frozen=True)
class StoreURL:
    kind: Kind
    nodes: tuple[tuple[str, int], ...] = ()  # the server, the cluster's seeds, or the Sentinels
    db: int = 0
    master: str = ""  # Sentinel: the name of the monitored master
    username: str | None = None
    password: str | None = dataclasses.field(default=None, repr=False)
    tls: TLS | None = None  # None: plain TCP
    sentinel_auth: bool = False  # Sentinel: the Sentinels take the same credentials


def parse_store_url(url: str) -> StoreURL:
    """The store `url` names; InvalidStoreURL when it names none."""
    scheme, sep, _ = url.partition("://")
    found = SCHEMES.get(scheme.lower()) if sep else None
    if found is None:
        forms = ", ".join(f"{s}://" for s in SCHEMES)
        raise InvalidStoreURL(f"must start with one of {forms}")
    kind, tls = found
    if kind == "memory":
        if url[len(scheme) + 3 :].strip("/"):
            raise InvalidStoreURL("memory:// takes no host, path or options")
        return StoreURL("memory")
    try:
        parts = urlsplit(url)
    except ValueError:
        raise InvalidStoreURL("is not a valid URL") from None
    if parts.fragment:
        raise InvalidStoreURL("takes no #fragment")
    userinfo, at, hosts = parts.netloc.rpartition("@")
    user, colon, password = userinfo.partition(":")
    nodes = tuple(_node(n, DEFAULT_PORT[kind]) for n in hosts.split(","))
    if kind == "redis" and len(nodes) > 1:
        raise InvalidStoreURL(
            "redis:// names one server; use redis+cluster:// or redis+sentinel:// for several"
        )
    master, db = _path(kind, parts.path)
    options = _options(parts.query, kind, tls)
    if options.get("sentinel_auth") and not (at and (user or colon)):
        raise InvalidStoreURL("sentinel_auth needs a user or password in the URL")
    return StoreURL(
        kind,
        nodes,
        db=db,
        master=master,
        username=unquote(user) if at and user else None,
        password=unquote(password) if at and colon else None,
        tls=_tls(options) if tls else None,
        sentinel_auth=bool(options.get("sentinel_auth", False)),
    )


def masked_url(url: str, *, mask_path: bool = False) -> str:
    """`url` with what may be a credential replaced by ***: the password (the whole userinfo
    when it is one name alone, as a token is given), every query value and, with
    `mask_path`, the path (webhooks often carry their token in it)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    end = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    userinfo, at, hosts = rest[:end].rpartition("@")
    user, colon, _ = userinfo.partition(":")
    authority = (f"{user}:***@" if colon else "***@") + hosts if at else hosts
    located, hash_sign, fragment = rest[end:].partition("#")
    path, question, query = located.partition("?")
    if mask_path and path not in ("", "/"):
        path = "/***"
    if query:
        query = "&".join(_masked_parameter(p) for p in query.split("&"))
    return f"{scheme}://{authority}{path}{question}{query}{hash_sign}{fragment}"


def _masked_parameter(parameter: str) -> str:
    name, equals, _ = parameter.partition("=")
    return f"{name}=***" if equals else "***" if parameter else ""


def _node(text: str, default_port: int) -> tuple[str, int]:
    if text.startswith("["):  # [IPv6 address]:port
        address, bracket, rest = text.partition("]")
        host, port = address + bracket, rest.removeprefix(":")
        if rest[:1] not in ("", ":"):
            port = rest
    else:
        host, _, port = text.partition(":")
    if not _HOST.fullmatch(host):
        raise InvalidStoreURL("every node needs a host (host:port, separated by commas)")
    if port and not (port.isdigit() and 1 <= int(port) <= 65535):
        raise InvalidStoreURL("a port must be a number from 1 to 65535")
    return host.strip("[]"), int(port) if port else default_port


def _path(kind: Kind, path: str) -> tuple[str, int]:
    """The Sentinel master's name and the database number."""
    if kind == "redis":
        if not _DB.fullmatch(path):
            raise InvalidStoreURL("the path must be a database number, as in redis://host/0")
        return "", int(path[1:] or 0)
    if kind == "cluster":
        if path not in ("", "/", "/0"):
            raise InvalidStoreURL("Redis Cluster has only database 0: leave the path out")
        return "", 0
    master, _, db = path.removeprefix("/").partition("/")
    if not master or not re.fullmatch(r"[0-9]{0,5}", db):
        raise InvalidStoreURL(
            "the path must name the master, as in redis+sentinel://host:26379/mymaster/0"
        )
    return unquote(master), int(db or 0)


def _options(query: str, kind: Kind, tls: bool) -> dict[str, str | bool]:
    known = (*(TLS_OPTIONS if tls else ()), *(("sentinel_auth",) if kind == "sentinel" else ()))
    options: dict[str, str | bool] = {}
    for name, value in parse_qsl(query, keep_blank_values=True):
        if name in TLS_OPTIONS and not tls:
            raise InvalidStoreURL(f"option {name} needs TLS: rediss://, rediss+cluster:// ...")
        if name not in known:
            # Not quoted: a mistyped URL may hold a secret there.
            listed = ", ".join(known) or "none"
            raise InvalidStoreURL(f"unknown option in the query (options here: {listed})")
        if name in options:
            raise InvalidStoreURL(f"option {name} is given twice")
        if name in ("ssl_check_hostname", "sentinel_auth"):
            if value.lower() not in _BOOLEANS:
                raise InvalidStoreURL(f"option {name} must be true or false")
            options[name] = _BOOLEANS[value.lower()]
        elif name == "ssl_cert_reqs":
            if value not in ("required", "optional", "none"):
                raise InvalidStoreURL("option ssl_cert_reqs must be required, optional or none")
            options[name] = value
        elif not value:
            raise InvalidStoreURL(f"option {name} needs a file path")
        else:
            options[name] = value
    return options


def _tls(options: dict[str, str | bool]) -> TLS:
    cert_reqs = str(options.get("ssl_cert_reqs", "required"))
    check_hostname = options.get("ssl_check_hostname", cert_reqs != "none")
    if check_hostname and cert_reqs == "none":
        raise InvalidStoreURL("ssl_check_hostname needs certificates checked (ssl_cert_reqs)")
    return TLS(
        ca_certs=_text(options.get("ssl_ca_certs")),
        certfile=_text(options.get("ssl_certfile")),
        keyfile=_text(options.get("ssl_keyfile")),
        cert_reqs=typing.cast(CertReqs, cert_reqs),  # checked in _options
        check_hostname=bool(check_hostname),
    )


def _text(value: str | bool | None) -> str | None:
    return value if isinstance(value, str) else None
