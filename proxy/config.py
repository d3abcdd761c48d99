"""The proxy's configuration: plain typed objects, validated once at start-up.

Every key is documented in docs/config.md. Secrets come from the environment through
`${VAR}` interpolation; `masked()` gives a copy that is safe to print.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import ipaddress
from collections.abc import Mapping
from pathlib import Path as FilePath
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

import policies

from .settings import ConfigError, Path, Source, build, convert, load_yaml

DEFAULT_CONFIG = FilePath(__file__).resolve().parent.parent / "config.yaml"


@dataclasses.dataclass(frozen=True)
class Listen:
    host: str = "127.0.0.1"
    port: int = 8080
    max_body_bytes: int = 32 * 1024 * 1024


@dataclasses.dataclass(frozen=True)
class Store:
    url: str = "memory://"
    ttl_seconds: int = 24 * 3600
    key_prefix: str = "cp"
    timeout_seconds: float = 0.5
    fail_open: bool = True
    max_sessions: int = 100_000
    max_branches: int = 4


@dataclasses.dataclass(frozen=True)
class Sessions:
    header: str = "X-Session-Id"
    policy_header: str = "X-Compaction-Policy"


@dataclasses.dataclass(frozen=True)
class InboundKey:
    id: str
    sha256: str


@dataclasses.dataclass(frozen=True)
class Auth:
    keys: tuple[InboundKey, ...] = ()
    header: str = "Authorization"
    allow_unauthenticated: bool = False


@dataclasses.dataclass(frozen=True)
class Timeouts:
    connect: float = 10.0
    first_byte: float = 300.0
    stream_idle: float = 120.0


@dataclasses.dataclass(frozen=True)
class Upstream:
    base_url: str
    kind: Literal["openai"] = "openai"
    api_key: str | None = None
    timeouts: Timeouts = Timeouts()
    name: str = dataclasses.field(default="", init=False)


@dataclasses.dataclass(frozen=True)
class ModelOverride:
    match: str
    context_window: int | None = None
    max_output_tokens: int | None = None
    upstream: str | None = None
    counting: Literal["auto", "exact", "estimate"] = "auto"
    encoding: str | None = None


@dataclasses.dataclass(frozen=True)
class Summarizer:
    upstream: str | None = None
    model: str | None = None
    timeout_seconds: float = 30.0
    retries: int = 2
    cooldown_seconds: float = 8.0
    temperature: float = 0.1


@dataclasses.dataclass(frozen=True)
class Policy:
    reserved_output_tokens: int = 4096
    safety_margin_tokens: int = 256
    prepare_at: float = 0.75
    compact_at: float = 0.9
    target: float = 0.7
    summarizer: Summarizer = Summarizer()
    compaction: policies.PolicyParams = dataclasses.field(default_factory=policies.PolicyParams)
    name: str = dataclasses.field(default="", init=False)

    def budget(
        self, window: int, model_max_output: int | None, request_max_tokens: int | None
    ) -> policies.Budget:
        """The budget of a request under this policy, for a model with this window."""
        return policies.make_budget(
            window=window,
            model_max_output=model_max_output,
            request_max_tokens=request_max_tokens,
            reserved_output_tokens=self.reserved_output_tokens,
            safety_margin_tokens=self.safety_margin_tokens,
            prepare_at=self.prepare_at,
            compact_at=self.compact_at,
            target=self.target,
        )


@dataclasses.dataclass(frozen=True)
class Route:
    policy: str
    model: str = "*"
    policy_header: str | None = None
    upstream: str | None = None


@dataclasses.dataclass(frozen=True)
class Admin:
    token: str | None = None


@dataclasses.dataclass(frozen=True)
class Logging:
    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["json", "text"] = "json"


@dataclasses.dataclass(frozen=True)
class Config:
    upstreams: dict[str, Upstream]
    listen: Listen = Listen()
    store: Store = Store()
    sessions: Sessions = Sessions()
    auth: Auth = Auth()
    default_upstream: str = ""
    default_context_window: int = 8192
    models: tuple[ModelOverride, ...] = ()
    policies: dict[str, Policy] = dataclasses.field(
        default_factory=lambda: {"default": _named(Policy(), "default")}
    )
    default_policy: str = "default"
    routes: tuple[Route, ...] = ()
    admin: Admin = Admin()
    logging: Logging = Logging()

    def model(self, model: str) -> ModelOverride | None:
        """The first per-model override whose glob matches `model`."""
        for override in self.models:
            if fnmatch.fnmatchcase(model, override.match):
                return override
        return None

    def route(self, model: str, policy_header: str | None) -> tuple[Policy, Upstream]:
        """The policy and upstream for a request: first matching route, else the defaults."""
        override = self.model(model)
        upstream_name = (override and override.upstream) or self.default_upstream
        for route in self.routes:
            if route.policy_header is not None and route.policy_header != policy_header:
                continue
            if fnmatch.fnmatchcase(model, route.model):
                return self.policies[route.policy], self.upstreams[route.upstream or upstream_name]
        return self.policies[self.default_policy], self.upstreams[upstream_name]

    def masked(self) -> dict[str, Any]:
        """The resolved config as plain data, with every secret replaced by '***'."""
        data = dataclasses.asdict(self)
        for upstream in data["upstreams"].values():
            if upstream["api_key"]:
                upstream["api_key"] = "***"
        if data["admin"]["token"]:
            data["admin"]["token"] = "***"  # noqa: S105 (the mask, not a password)
        data["store"]["url"] = _mask_url(data["store"]["url"])
        for policy in data["policies"].values():
            # As written in the file: a layer is a mapping of its name to its parameters.
            compaction = policy["compaction"]
            compaction["layers"] = [{name: params} for name, params in compaction["layers"]]
        return data


def _named(obj: Any, name: str) -> Any:
    object.__setattr__(obj, "name", name)
    return obj


def _mask_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port:
        host += f":{parts.port}"
    user = f"{parts.username}:" if parts.username else ":"
    return urlunsplit(parts._replace(netloc=f"{user}***@{host}"))


def _read_policy(data: Any, path: Path, source: Source) -> Policy:
    """A policy is its budget and summarizer keys plus the compaction parameters, flat."""
    if not isinstance(data, dict):
        source.problem(path, "expected a mapping")
        return Policy()
    own = {f.name for f in dataclasses.fields(Policy) if f.init} - {"compaction"}
    budget = {k: v for k, v in data.items() if k in own}
    rest = {k: v for k, v in data.items() if k not in own}
    compaction = build(
        policies.PolicyParams,
        rest,
        path,
        source,
        {"layers": _read_layers, "anchors": _read_anchors},
    )
    policy = build(Policy, budget, path, source, {})
    if policy is None or compaction is None:
        return Policy()
    return dataclasses.replace(policy, compaction=compaction)


def _read_layers(data: Any, path: Path, source: Source) -> tuple[policies.LayerSpec, ...]:
    if not isinstance(data, list):
        source.problem(path, "expected a list of layers")
        return ()
    specs = []
    for i, item in enumerate(data):
        where = (*path, i)
        name, params = (item, {}) if isinstance(item, str) else _single_key(item, where, source)
        if name is None:
            continue
        layer = policies.LAYERS.get(name)
        if layer is None:
            known = ", ".join(policies.LAYERS)
            source.problem(where, f"unknown layer {name!r} (known layers: {known})")
            continue
        built = build(layer.params, params, (*where, name), source, {})
        if built is not None:
            specs.append(policies.LayerSpec(name, built))
    return tuple(specs)


def _single_key(item: Any, path: Path, source: Source) -> tuple[str | None, Any]:
    if isinstance(item, dict) and len(item) == 1:
        ((name, params),) = item.items()
        return str(name), params
    source.problem(path, "a layer is its name, or a mapping of its name to its parameters")
    return None, None


def _read_anchors(data: Any, path: Path, source: Source) -> tuple[str, ...]:
    import re

    anchors: tuple[str, ...] = convert(tuple[str, ...], data, path, source, {})
    for i, pattern in enumerate(anchors):
        try:
            re.compile(pattern)
        except re.error as exc:
            source.problem((*path, i), f"not a valid regular expression: {exc}")
    return anchors


def parse(data: Any, source: Source) -> Config:
    """Build and cross-check a Config from already-parsed YAML data."""
    if data is None:
        data = {}
    raw_policies = data.get("policies") if isinstance(data, dict) else None
    if isinstance(data, dict):
        data = {k: v for k, v in data.items() if k != "policies"}
    config = build(Config, data, (), source, {})
    parsed_policies: dict[str, Policy] = {}
    if raw_policies is not None:
        if not isinstance(raw_policies, dict):
            source.problem(("policies",), "expected a mapping of policy names to policies")
        else:
            for name, value in raw_policies.items():
                policy = _read_policy(value, ("policies", str(name)), source)
                parsed_policies[str(name)] = _named(policy, str(name))
    if source.problems or config is None:
        raise ConfigError(source.problems)
    if parsed_policies:
        config = dataclasses.replace(config, policies=parsed_policies)
    for name, upstream in config.upstreams.items():
        _named(upstream, name)
    config = _with_default_upstream(config, source)
    _check(config, source)
    if source.problems:
        raise ConfigError(source.problems)
    return config


def _with_default_upstream(config: Config, source: Source) -> Config:
    if config.default_upstream or len(config.upstreams) != 1:
        return config
    return dataclasses.replace(config, default_upstream=next(iter(config.upstreams)))


def _check(config: Config, source: Source) -> None:
    """Cross-field rules that no single type can say."""
    p = source.problem
    if not config.upstreams:
        p(("upstreams",), "at least one upstream is required")
    if config.default_upstream not in config.upstreams:
        p(("default_upstream",), f"names no upstream: {config.default_upstream!r}")
    for name, upstream in config.upstreams.items():
        parts = urlsplit(upstream.base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            p(("upstreams", name, "base_url"), "must be an http:// or https:// URL")
        for field in dataclasses.fields(upstream.timeouts):
            if getattr(upstream.timeouts, field.name) <= 0:
                p(("upstreams", name, "timeouts", field.name), "must be positive")
    if not 1 <= config.listen.port <= 65535:
        p(("listen", "port"), "must be between 1 and 65535")
    if config.listen.max_body_bytes < 1024:
        p(("listen", "max_body_bytes"), "must be at least 1024")
    if not config.store.url.startswith(("memory://", "redis://", "rediss://")):
        p(("store", "url"), "must start with memory://, redis:// or rediss://")
    if config.store.ttl_seconds <= 0:
        p(("store", "ttl_seconds"), "must be positive")
    if config.store.timeout_seconds <= 0:
        p(("store", "timeout_seconds"), "must be positive")
    if config.default_context_window < 256:
        p(("default_context_window",), "must be at least 256")
    for i, override in enumerate(config.models):
        if override.upstream is not None and override.upstream not in config.upstreams:
            p(("models", i, "upstream"), f"names no upstream: {override.upstream!r}")
        if override.context_window is not None and override.context_window < 256:
            p(("models", i, "context_window"), "must be at least 256")
    for name, policy in config.policies.items():
        where = ("policies", name)
        if not 0 < policy.target < policy.compact_at <= 1:
            p(where, "levels must satisfy 0 < target < compact_at <= 1")
        if not 0 < policy.prepare_at <= policy.compact_at:
            p((*where, "prepare_at"), "must be in (0, compact_at]")
        if policy.reserved_output_tokens < 0 or policy.safety_margin_tokens < 0:
            p(where, "reserved_output_tokens and safety_margin_tokens must not be negative")
        summarizer = policy.summarizer.upstream
        if summarizer is not None and summarizer not in config.upstreams:
            p((*where, "summarizer", "upstream"), f"names no upstream: {summarizer!r}")
    if config.default_policy not in config.policies:
        p(("default_policy",), f"names no policy: {config.default_policy!r}")
    for i, route in enumerate(config.routes):
        if route.policy not in config.policies:
            p(("routes", i, "policy"), f"names no policy: {route.policy!r}")
        if route.upstream is not None and route.upstream not in config.upstreams:
            p(("routes", i, "upstream"), f"names no upstream: {route.upstream!r}")
    for i, key in enumerate(config.auth.keys):
        if len(key.sha256) != 64 or any(c not in "0123456789abcdef" for c in key.sha256):
            p(("auth", "keys", i, "sha256"), "must be 64 lowercase hex characters")
    _check_open_relay(config, source)


def _check_open_relay(config: Config, source: Source) -> None:
    holds_key = [n for n, u in config.upstreams.items() if u.api_key]
    if config.auth.keys and config.auth.header.lower() == "authorization":
        passthrough = [n for n, u in config.upstreams.items() if not u.api_key]
        if passthrough:
            source.problem(
                ("auth", "header"),
                "clients present their proxy key in Authorization, so upstreams without an "
                f"api_key ({', '.join(passthrough)}) would get no credential: give them an "
                "api_key or set auth.header to another header (e.g. X-Proxy-Key)",
            )
    open_relay = holds_key and not config.auth.keys and not config.auth.allow_unauthenticated
    if open_relay and not _is_loopback(config.listen.host):
        source.problem(
            ("auth",),
            f"upstreams {', '.join(holds_key)} hold their own api_key and the proxy listens "
            f"on {config.listen.host}: anyone who reaches it would spend that key. Configure "
            "auth.keys, listen on 127.0.0.1, or set auth.allow_unauthenticated: true",
        )


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def load(path: str | FilePath | None = None, *, listen: Mapping[str, Any] | None = None) -> Config:
    """Read, interpolate and validate a config file; raises ConfigError naming every problem.

    `listen` overrides keys of the `listen` section (the command line's --host and --port).
    """
    file = FilePath(path) if path is not None else DEFAULT_CONFIG
    source = Source(name=str(file))
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError([f"{file}: cannot read: {exc.strerror}"]) from None
    data = load_yaml(text, source)
    if listen:
        if not isinstance(data, dict):
            data = {}
        section = data.get("listen")
        data["listen"] = {**(section if isinstance(section, dict) else {}), **listen}
    return parse(data, source)


def loads(text: str, name: str = "<config>") -> Config:
    """Like `load`, from a string (tests, embedded defaults)."""
    source = Source(name=name)
    return parse(load_yaml(text, source), source)
