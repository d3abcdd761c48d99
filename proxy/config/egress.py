"""Egress proxies: whether a connection to an upstream (or a hook) goes through one, and which.

An upstream's `proxy` setting decides when it is given (`none`: straight); otherwise the
environment does, as curl reads it: `https_proxy` / `HTTPS_PROXY` for https URLs,
`http_proxy` / `HTTP_PROXY` for http ones (the lowercase first), unless `no_proxy` /
`NO_PROXY` lists the host. Nothing else bypasses the proxy, not even localhost.

A proxy URL is `http://[user:password@]host[:port]` (`https://` for TLS to the proxy itself;
no scheme reads as http); its user and password become `Proxy-Authorization: Basic`.
"""

from __future__ import annotations

import base64
import dataclasses
import ipaddress
import os
import re
from collections.abc import Mapping
from urllib.parse import SplitResult, unquote, urlsplit

DIRECT = "none"  # an upstream's `proxy` for no proxy at all, whatever the environment says


class InvalidEgressProxy(ValueError):
    """A proxy URL the client cannot use; `problem` says why without repeating the URL (it
    may hold a password)."""

    def __init__(self, problem: str) -> None:
        super().__init__(problem)
        self.problem = problem


@dataclasses.dataclass(frozen=True)
class EgressProxy:
    host: str
    port: int
    tls: bool  # TLS to the proxy itself (an https:// proxy URL)
    authorization: str | None  # the Proxy-Authorization value, from the URL's user and password


def parse_egress_proxy(url: str) -> EgressProxy:
    """The proxy at `url`; InvalidEgressProxy when it is none the client can use."""
    parts = urlsplit(url if "://" in url else f"http://{url}")
    if parts.scheme not in ("http", "https"):
        raise InvalidEgressProxy(
            "must be an http:// or https:// proxy URL (SOCKS is not supported)"
        )
    try:
        port = parts.port
    except ValueError:
        raise InvalidEgressProxy("has a port that is not a number from 0 to 65535") from None
    if not parts.hostname:
        raise InvalidEgressProxy("names no host")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise InvalidEgressProxy("must be a proxy's address alone, without a path or query")
    tls = parts.scheme == "https"
    return EgressProxy(parts.hostname, port or (443 if tls else 80), tls, basic_credentials(parts))


def basic_credentials(parts: SplitResult) -> str | None:
    """The Basic credentials (`Basic …`) of a URL's user and password, if it has a user."""
    if parts.username is None:
        return None
    pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
    return "Basic " + base64.b64encode(pair.encode()).decode()


def egress_proxy(
    url: SplitResult, setting: str | None, environ: Mapping[str, str] = os.environ
) -> EgressProxy | None:
    """The proxy a connection to `url` (http or https) goes through, None for none: by
    `setting` (an upstream's `proxy`), else by the environment."""
    if setting is not None:
        return None if setting == DIRECT else parse_egress_proxy(setting)
    found = _variable(environ, f"{url.scheme}_proxy")
    if found is None:
        return None
    rules = _variable(environ, "no_proxy")
    port = url.port or (443 if url.scheme == "https" else 80)
    if rules is not None and bypassed(rules[1], url.hostname or "", port):
        return None
    return parse_egress_proxy(found[1])


def environment_problems(environ: Mapping[str, str] = os.environ) -> list[str]:
    """What is wrong with the environment's proxy URLs, a line each (never their values)."""
    problems = []
    for scheme in ("https", "http"):
        found = _variable(environ, f"{scheme}_proxy")
        if found is None:
            continue
        try:
            parse_egress_proxy(found[1])
        except InvalidEgressProxy as exc:
            problems.append(f"environment variable {found[0]}: {exc.problem}")
    return problems


def bypassed(rules: str, host: str, port: int) -> bool:
    """Whether NO_PROXY's `rules` send `host`:`port` straight. They are separated by commas
    (or blanks): `*` for every host; a name, matching itself and the names under it, with or
    without a leading dot (`example.com` and `.example.com` match `api.example.com`, not
    `myexample.com`); an IP address or network (`10.0.0.0/8`, `fe80::/10`), matching the
    host's address when the host is one (names are never resolved for this); each may end
    in `:port` for that port alone (`[::1]:8080` for IPv6)."""
    host = host.lower().rstrip(".")
    try:
        address: ipaddress.IPv4Address | ipaddress.IPv6Address | None
        address = ipaddress.ip_address(host)
    except ValueError:
        address = None
    for rule in re.split(r"[\s,]+", rules):
        if rule == "*":
            return True
        name, rule_port = _split_port(rule)
        if not name or (rule_port is not None and rule_port != port):
            continue
        if address is None:
            name = name.lower().rstrip(".").removeprefix(".")
            if host == name or host.endswith(f".{name}"):
                return True
            continue
        try:
            if address in ipaddress.ip_network(name, strict=False):
                return True
        except ValueError:
            continue  # a name: never an address's
    return False


def _split_port(rule: str) -> tuple[str, int | None]:
    """A rule's host and port (None: any); a port that is not a number matches none."""
    if rule.startswith("["):
        host, _, rest = rule[1:].partition("]")
        port = rest.removeprefix(":") if rest.startswith(":") else None
    elif rule.count(":") == 1:
        host, port = rule.split(":")
    else:
        return rule, None  # a name, an IPv4 address, or a bare IPv6 address or network
    if port is None:
        return host, None
    return (host, int(port)) if port.isdigit() else ("", None)


def _variable(environ: Mapping[str, str], name: str) -> tuple[str, str] | None:
    """The variable `name` or its uppercase form (the lowercase first, as curl): its name and
    value; None when neither is set to something."""
    for spelled in (name, name.upper()):
        value = environ.get(spelled, "").strip()
        if value:
            return spelled, value
    return None
