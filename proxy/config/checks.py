"""The rules of a config that its types cannot say, each once and naming its key: ranges and
URL forms, names that must exist, which upstreams serve which wire formats, no open relay.

The engine's policy checks its own rules (`policies.Policy`); the decoder reports them.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re
from collections.abc import Callable
from urllib.parse import urlsplit

from proxy.config.decoder import Path, Source
from proxy.config.egress import DIRECT, InvalidEgressProxy, environment_problems, parse_egress_proxy
from proxy.config.provider_params import PROVIDER_PARAMS
from proxy.config.schema import DIALECTS, Config, Upstream
from proxy.config.store_url import InvalidStoreURL, parse_store_url

Problem = Callable[[Path, str], None]
MIN_SIGNING_KEY = 32  # characters of a compaction item signing key: 128 bits and more
# A header name, RFC 9110 section 5.1's token (the upstream client sends no other).
_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
MAX_DASHBOARD_TURNS = 2000  # a turn's figures take about 40 bytes of the session's record


def check(config: Config, source: Source) -> None:
    """Note every rule `config` breaks in `source`."""
    p = source.problem
    _check_upstreams(config, p)
    source.problems += environment_problems()
    _check_listen_and_store(config, p)
    for i, override in enumerate(config.models):
        if override.upstream is not None and override.upstream not in config.upstreams:
            p(("models", i, "upstream"), f"names no upstream: {override.upstream!r}")
        if override.context_window is not None and override.context_window < 256:
            p(("models", i, "context_window"), "must be at least 256")
        if override.provider_model is not None:
            _check_template(override.provider_model, ("models", i, "provider_model"), p)
            named = config.upstreams.get(override.upstream or "")
            if named is not None and named.kind != "litellm":
                where = ("models", i, "provider_model")
                p(where, "only for models sent to an upstream of kind litellm")
    for name, policy in config.policies.items():
        summarizer = policy.summarizer.upstream
        if summarizer is not None and summarizer not in config.upstreams:
            p(("policies", name, "summarizer", "upstream"), f"names no upstream: {summarizer!r}")
        for seconds in ("timeout_seconds", "request_wait_seconds"):
            if getattr(policy.summarizer, seconds) <= 0:
                p(("policies", name, "summarizer", seconds), "must be positive")
        if not 0 < policy.exact_count.margin <= 1:
            p(("policies", name, "exact_count", "margin"), "must be above 0 and at most 1")
        if policy.exact_count.timeout_seconds <= 0:
            p(("policies", name, "exact_count", "timeout_seconds"), "must be positive")
        if policy.exact_count.cooldown_seconds < 0:
            p(("policies", name, "exact_count", "cooldown_seconds"), "must not be negative")
        for field, problem in policy.retrieval.problems():
            p(("policies", name, "retrieval", field), problem)
    if config.default_policy not in config.policies:
        p(("default_policy",), f"names no policy: {config.default_policy!r}")
    _check_routes(config, p)
    _check_summary_roles(config, p)
    _check_hooks(config, p)
    for i, key in enumerate(config.auth.keys):
        if len(key.sha256) != 64 or any(c not in "0123456789abcdef" for c in key.sha256):
            p(("auth", "keys", i, "sha256"), "must be 64 lowercase hex characters")
    _check_open_relay(config, p)
    dashboard = config.admin.dashboard
    if not 1 <= dashboard.turns <= MAX_DASHBOARD_TURNS:
        p(("admin", "dashboard", "turns"), f"must be between 1 and {MAX_DASHBOARD_TURNS}")
    if dashboard.write_seconds <= 0:
        p(("admin", "dashboard", "write_seconds"), "must be positive")
    signing_key = config.compaction_items.signing_key
    if signing_key is not None and len(signing_key) < MIN_SIGNING_KEY:
        p(("compaction_items", "signing_key"), f"must be at least {MIN_SIGNING_KEY} characters")


def _check_upstreams(config: Config, p: Problem) -> None:
    if not config.upstreams:
        p(("upstreams",), "at least one upstream is required")
    for name, upstream in config.upstreams.items():
        if not upstream.base_url and upstream.kind != "litellm":
            p(("upstreams", name, "base_url"), "is required")
        elif upstream.base_url and not _is_http_url(upstream.base_url):
            p(("upstreams", name, "base_url"), "must be an http:// or https:// URL")
        _check_provider_settings(name, upstream, p)
        for field in dataclasses.fields(upstream.timeouts):
            if getattr(upstream.timeouts, field.name) <= 0:
                p(("upstreams", name, "timeouts", field.name), "must be positive")
        if not 0 <= upstream.retries <= 10:
            p(("upstreams", name, "retries"), "must be between 0 and 10")
        if upstream.max_connections < 1:
            p(("upstreams", name, "max_connections"), "must be at least 1")
        if upstream.max_answer_bytes < 1024:
            p(("upstreams", name, "max_answer_bytes"), "must be at least 1024")
        _check_proxy(name, upstream, p)
    if isinstance(config.default_upstream, str):
        if not config.default_upstream:
            names = ", ".join(config.upstreams)
            p(
                ("default_upstream",),
                f"is required with more than one upstream ({names}): the one every API goes "
                "to, or one per API ({chat: NAME, responses: NAME, messages: NAME})",
            )
        elif config.default_upstream not in config.upstreams:
            p(("default_upstream",), f"names no upstream: {config.default_upstream!r}")
        return
    for dialect, name in config.default_upstream.items():
        where = ("default_upstream", dialect)
        if name not in config.upstreams:
            p(where, f"names no upstream: {name!r}")
        elif not config.upstreams[name].serves(dialect):
            p(where, f"{_serving(config, name)}, not {dialect}")


def _check_proxy(name: str, upstream: Upstream, p: Problem) -> None:
    if upstream.proxy is None:
        return
    if upstream.kind == "litellm":
        p(
            ("upstreams", name, "proxy"),
            "not for upstreams of kind litellm, which read HTTPS_PROXY and NO_PROXY themselves",
        )
        return
    if upstream.proxy == DIRECT:
        return
    try:
        parse_egress_proxy(upstream.proxy)
    except InvalidEgressProxy as exc:
        p(("upstreams", name, "proxy"), f"{exc.problem}, or none for no proxy")


def _check_provider_settings(name: str, upstream: Upstream, p: Problem) -> None:
    """What only upstreams of kind litellm take, and the provider settings litellm is given."""
    if upstream.kind != "litellm":
        given = {"provider_model": upstream.provider_model is not None}
        given |= {"provider_params": bool(upstream.provider_params)}
        given |= {"prompt_cache": upstream.prompt_cache is not None}
        for key in sorted(k for k, v in given.items() if v):
            p(("upstreams", name, key), "only for upstreams of kind litellm")
        return
    if upstream.provider_model is not None:
        _check_template(upstream.provider_model, ("upstreams", name, "provider_model"), p)
    for key in sorted(upstream.provider_params.keys() - PROVIDER_PARAMS):
        hint = {"api_key": "api_key", "api_base": "base_url"}.get(key)
        known = (
            f"set it as the upstream's {hint}"
            if hint
            else "known: " + ", ".join(sorted(PROVIDER_PARAMS))
        )
        p(("upstreams", name, "provider_params", key), f"not a provider setting ({known})")


def _check_template(template: str, where: Path, p: Problem) -> None:
    rest = template.replace("{model}", "")
    if not template.strip() or "{" in rest or "}" in rest or any(c.isspace() for c in template):
        p(where, "must be a model name without spaces; {model} stands for the request's model")


def _check_listen_and_store(config: Config, p: Problem) -> None:
    if not 1 <= config.listen.port <= 65535:
        p(("listen", "port"), "must be between 1 and 65535")
    if config.listen.max_body_bytes < 1024:
        p(("listen", "max_body_bytes"), "must be at least 1024")
    if config.listen.max_head_bytes < 1024:
        p(("listen", "max_head_bytes"), "must be at least 1024")
    if config.listen.max_header_fields < 1:
        p(("listen", "max_header_fields"), "must be at least 1")
    if config.listen.max_concurrent_requests < 1:
        p(("listen", "max_concurrent_requests"), "must be at least 1")
    for key in ("shutdown_delay_seconds", "shutdown_grace_seconds", "websocket_history_bytes"):
        if getattr(config.listen, key) < 0:
            p(("listen", key), "must not be negative")
    try:
        store = parse_store_url(config.store.url)
    except InvalidStoreURL as exc:
        p(("store", "url"), exc.problem)
    else:
        if config.listen.workers > 1 and store.kind == "memory":
            problem = "more than one worker needs a session store the workers share (redis://"
            p(("listen", "workers"), problem + "); memory:// keeps sessions inside one process")
    if config.listen.workers < 1:
        p(("listen", "workers"), "must be at least 1")
    if config.store.ttl_seconds <= 0:
        p(("store", "ttl_seconds"), "must be positive")
    if config.store.timeout_seconds <= 0:
        p(("store", "timeout_seconds"), "must be positive")
    for key in ("session_bytes", "total_bytes"):
        if getattr(config.store.originals, key) <= 0:
            p(("store", "originals", key), "must be positive")
    if not config.store.key_prefix or {"{", "}"} & set(config.store.key_prefix):
        # Braces would break the Redis Cluster hash tag that keeps a session's keys together.
        p(("store", "key_prefix"), "must be non-empty and without braces")
    if config.default_context_window < 256:
        p(("default_context_window",), "must be at least 256")


def _check_routes(config: Config, p: Problem) -> None:
    for i, route in enumerate(config.routes):
        if route.policy not in config.policies:
            p(("routes", i, "policy"), f"names no policy: {route.policy!r}")
        if route.dialects is not None and not route.dialects:
            p(("routes", i, "dialects"), "names no dialect (leave it out for every dialect)")
        if route.upstream is None:
            continue
        if route.upstream not in config.upstreams:
            p(("routes", i, "upstream"), f"names no upstream: {route.upstream!r}")
            continue
        dialects = route.dialects or DIALECTS
        if not any(config.upstreams[route.upstream].serves(d) for d in dialects):
            p(
                ("routes", i, "upstream"),
                f"{_serving(config, route.upstream)}, none of the route's dialects "
                f"({', '.join(dialects)})",
            )


def _check_summary_roles(config: Config, p: Problem) -> None:
    """A policy that may serve Anthropic Messages requests puts its summary in a user message:
    the API has no other place for it (`system` is a field of its own, never changed)."""

    def serves(name: str | None) -> bool:
        upstream = config.upstreams.get(name or "")
        return upstream is not None and upstream.serves("messages")

    fallbacks = [config.default_upstream_for("messages"), *(m.upstream for m in config.models)]
    by_default = any(serves(name) for name in fallbacks)
    users: dict[str, str] = {}
    if by_default:
        users[config.default_policy] = "as the default policy"
    for i, route in enumerate(config.routes):
        if route.dialects is not None and "messages" not in route.dialects:
            continue
        if serves(route.upstream) or (route.upstream is None and by_default):
            users.setdefault(route.policy, f"through routes[{i}]")
    for name, where in users.items():
        policy = config.policies.get(name)
        if policy is not None and policy.compaction.summary_role != "user":
            p(
                ("policies", name, "summary_role"),
                f"must be user: the policy serves Anthropic Messages requests ({where}), "
                "whose summary is a user message",
            )


def _check_hooks(config: Config, p: Problem) -> None:
    for name in ("pre_compact", "post_compact"):
        hook = getattr(config.hooks, name)
        if hook is None:
            continue
        if not _is_http_url(hook.url):
            p(("hooks", name, "url"), "must be an http:// or https:// URL")
        if hook.timeout_seconds <= 0:
            p(("hooks", name, "timeout_seconds"), "must be positive")
        if hook.max_in_flight < 1:
            p(("hooks", name, "max_in_flight"), "must be at least 1")
        for header, value in hook.headers.items():
            if _HEADER_NAME.fullmatch(header) is None or "\n" in value or "\r" in value:
                where = ("hooks", name, "headers", header)
                p(
                    where,
                    "must be a header name (letters, digits and !#$%&'*+-.^_`|~), "
                    "its value on one line",
                )


def _is_http_url(url: str) -> bool:
    parts = urlsplit(url)
    return parts.scheme in ("http", "https") and bool(parts.hostname)


def _serving(config: Config, name: str) -> str:
    upstream = config.upstreams[name]
    return (
        f"upstream {name!r} is of kind {upstream.kind}, which serves {', '.join(upstream.dialects)}"
    )


def _check_open_relay(config: Config, p: Problem) -> None:
    # An upstream of kind litellm never takes the client's credential: it signs in with its
    # api_key or the provider's own credentials from the environment (AWS, Google, ...).
    holds_key = [n for n, u in config.upstreams.items() if u.api_key or u.kind == "litellm"]
    if config.auth.keys and config.auth.header.lower() == "authorization":
        # Anthropic clients can still send their own key in x-api-key.
        passthrough = [
            n for n, u in config.upstreams.items() if n not in holds_key and u.kind != "anthropic"
        ]
        if passthrough:
            p(
                ("auth", "header"),
                "clients present their proxy key in Authorization, so upstreams without an "
                f"api_key ({', '.join(passthrough)}) would get no credential: give them an "
                "api_key or set auth.header to another header (e.g. X-Proxy-Key)",
            )
    open_relay = holds_key and not config.auth.keys and not config.auth.allow_unauthenticated
    if open_relay and not is_loopback(config.listen.host):
        keyed = all(config.upstreams[n].api_key for n in holds_key)
        holders = (
            f"upstream {holds_key[0]!r} holds its own {'api_key' if keyed else 'credentials'}"
            if len(holds_key) == 1
            else f"upstreams {', '.join(repr(n) for n in holds_key)} hold their own "
            + ("api_keys" if keyed else "credentials")
        )
        p(
            ("auth",),
            f"{holders} and the proxy listens on {config.listen.host}, so anyone who reaches "
            "it could spend them. Configure auth.keys, listen on 127.0.0.1, or set "
            "auth.allow_unauthenticated: true",
        )


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
