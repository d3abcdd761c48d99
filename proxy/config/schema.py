"""The configuration as plain, typed, frozen objects, and how a request is routed by it.

Every key is documented in docs/config.md; the rules no type can say are in `checks.py`."""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Mapping
from typing import Any, Literal, get_args

import policies
from proxy.config.provider_params import SECRET_PROVIDER_PARAMS
from proxy.config.retrieval import Retrieval, StoredOriginals
from proxy.config.store_url import masked_url
from proxy.errors import ProxyError

Dialect = Literal["chat", "responses", "messages"]
"""A wire format the proxy accepts: chat completions (/v1/chat/completions), the Responses
API (/v1/responses) or Anthropic Messages (/v1/messages)."""
DIALECTS: tuple[str, ...] = get_args(Dialect)

Kind = Literal["openai", "anthropic", "litellm"]

# The wire formats each kind of upstream serves.
DIALECTS_BY_KIND: Mapping[str, tuple[Dialect, ...]] = {
    "openai": ("chat", "responses"),
    "anthropic": ("messages",),
    "litellm": ("chat", "messages", "responses"),
}


class NoRoute(ProxyError):
    """No configured upstream serves this request's wire format for its model."""


@dataclasses.dataclass(frozen=True)
class Listen:
    host: str = "127.0.0.1"
    port: int = 8080
    max_body_bytes: int = 32 * 1024 * 1024
    # A request's line and header fields (nginx's bound is 32 KiB too; Apache's 100 fields).
    max_head_bytes: int = 32 * 1024
    max_header_fields: int = 100
    max_concurrent_requests: int = 512
    shutdown_delay_seconds: float = 5.0
    shutdown_grace_seconds: float = 30.0
    websockets: bool = True
    websocket_history_bytes: int = 8 * 1024 * 1024
    workers: int = 1  # processes serving the one listener (proxy/server/workers.py)


@dataclasses.dataclass(frozen=True)
class Store:
    url: str = "memory://"
    ttl_seconds: int = 24 * 3600
    key_prefix: str = "cp"
    timeout_seconds: float = 0.5
    fail_open: bool = True
    max_sessions: int = 10_000
    max_branches: int = 4
    originals: StoredOriginals = dataclasses.field(default_factory=StoredOriginals)


@dataclasses.dataclass(frozen=True)
class Sessions:
    header: str = "X-Session-Id"
    policy_header: str = "X-Compaction-Policy"
    shadow_header: str = "X-Compaction-Shadow"


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


_LITELLM_ONLY = ("provider_model", "provider_params", "prompt_cache")
# Provider models whose prompt cache the proxy marks unless the upstream says otherwise.
PROMPT_CACHE_MODELS = ("anthropic/*", "bedrock/*anthropic*")


@dataclasses.dataclass(frozen=True)
class Upstream:
    base_url: str = ""  # required, except for kind litellm (its api_base, when given)
    kind: Kind = "openai"
    api_key: str | None = None
    timeouts: Timeouts = Timeouts()
    # Kind litellm only: the model litellm is asked for ("{model}" is the request's model),
    # the provider's own settings, and whether to mark the prompt cache (None: by model).
    provider_model: str | None = None
    provider_params: dict[str, str] = dataclasses.field(default_factory=dict)
    prompt_cache: bool | None = None
    retries: int = 2
    max_connections: int = 512
    # What of a non-streamed answer the proxy holds to read its usage; past it, relayed.
    max_answer_bytes: int = 16 * 1024 * 1024
    # HTTP kinds: the egress proxy to go through (proxy.config.egress): a URL, `none` for
    # none; None: as the environment says (HTTPS_PROXY, HTTP_PROXY, NO_PROXY).
    proxy: str | None = None
    name: str = dataclasses.field(default="", init=False)

    @property
    def dialects(self) -> tuple[Dialect, ...]:
        """The wire formats it serves."""
        return DIALECTS_BY_KIND[self.kind]

    def serves(self, dialect: str) -> bool:
        return dialect in self.dialects

    def caches_prompt(self, provider_model: str) -> bool:
        """Whether the proxy marks the stable prefix for the provider's prompt cache."""
        if self.prompt_cache is not None:
            return self.prompt_cache
        return any(fnmatch.fnmatchcase(provider_model, glob) for glob in PROMPT_CACHE_MODELS)


@dataclasses.dataclass(frozen=True)
class ModelOverride:
    match: str
    context_window: int | None = None
    max_output_tokens: int | None = None
    upstream: str | None = None
    counting: Literal["auto", "exact", "estimate"] = "auto"
    encoding: str | None = None
    provider_model: str | None = None  # for upstreams of kind litellm, as theirs


@dataclasses.dataclass(frozen=True)
class Summarizer:
    upstream: str | None = None
    model: str | None = None
    timeout_seconds: float = 30.0
    retries: int = 2
    cooldown_seconds: float = 8.0
    temperature: float = 0.1
    # How long a request waits for its summary before it degrades; the summary is finished
    # in the background (every retry with its full timeout) and used from the next turn.
    request_wait_seconds: float = 3.0


@dataclasses.dataclass(frozen=True)
class ExactCount:
    """The upstream's exact count of what is sent, asked for when the estimate is near the
    compaction level, on APIs that have a count endpoint (Anthropic's count_tokens)."""

    via: Literal["none", "count_tokens"] = "none"
    margin: float = 0.15  # near: within this fraction of the compaction level, either side
    timeout_seconds: float = 2.0
    # After a count failed or was late, the estimate decides at once for this long.
    cooldown_seconds: float = 30.0


@dataclasses.dataclass(frozen=True)
class Policy:
    """A named policy: the engine's policy (levels, protection, anchors, layers), the
    summarizer that writes its summaries and how the view is marked for prompt caches. In
    the file the engine's keys sit flat in it."""

    summarizer: Summarizer = Summarizer()
    # Anthropic Messages: add the proxy's own prompt-cache breakpoints in the slots the
    # client left free (docs/anthropic.md).
    cache_breakpoints: bool = True
    # Responses API: provider compaction (/v1/responses/compact, a compaction_trigger item)
    # relayed to the upstream, or served by the proxy itself (docs/responses.md).
    provider_compaction: Literal["relay", "serve"] = "relay"
    # An overflow by max_tokens no compaction makes room for: relayed, or max_tokens lowered.
    max_tokens_overflow: Literal["relay", "lower"] = "lower"
    # Compute, store and report what compaction would do, but forward the client's request
    # unchanged (a rollout that only observes).
    shadow: bool = False
    exact_count: ExactCount = ExactCount()
    retrieval: Retrieval = dataclasses.field(default_factory=Retrieval)
    compaction: policies.Policy = dataclasses.field(
        default_factory=policies.Policy, metadata={"flat": True}
    )
    name: str = dataclasses.field(default="", init=False)


@dataclasses.dataclass(frozen=True)
class Hook:
    """An HTTP webhook told about compactions (docs/config.md, `hooks`)."""

    url: str
    timeout_seconds: float = 1.0
    include_text: bool = False  # message, summary and anchor text in the payload
    headers: dict[str, str] = dataclasses.field(default_factory=dict)
    max_in_flight: int = 64  # calls under way at once; past it a call is dropped


@dataclasses.dataclass(frozen=True)
class Hooks:
    pre_compact: Hook | None = None  # before a summary is requested; may add instructions
    post_compact: Hook | None = None  # the outcome of a compaction, off the request path


@dataclasses.dataclass(frozen=True)
class Route:
    policy: str
    model: str = "*"
    policy_header: str | None = None
    upstream: str | None = None
    dialects: tuple[Dialect, ...] | None = None  # None: every dialect

    def matches(self, dialect: str, model: str, policy_header: str | None) -> bool:
        if self.policy_header is not None and self.policy_header != policy_header:
            return False
        if self.dialects is not None and dialect not in self.dialects:
            return False
        return fnmatch.fnmatchcase(model, self.model)


@dataclasses.dataclass(frozen=True)
class Dashboard:
    """The sessions page (`proxy.server.dashboard`), on wherever the admin API is."""

    enabled: bool = True
    # Served without the admin token when the proxy listens on loopback only (and never else).
    open_on_loopback: bool = False
    turns: int = 200  # the figures of a session's last turns kept in its record
    write_seconds: float = 5.0  # a session's turns written at most this often, this late


@dataclasses.dataclass(frozen=True)
class Admin:
    token: str | None = None
    dashboard: Dashboard = Dashboard()


@dataclasses.dataclass(frozen=True)
class CompactionItems:
    """The compaction items the proxy issues when it serves provider compaction."""

    # Signs them (HMAC-SHA256); None: a random key of this process, so that its items do not
    # outlive it nor travel to other replicas.
    signing_key: str | None = None


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
    # An upstream name for every dialect it serves, or a mapping of dialects to names.
    default_upstream: str | dict[Dialect, str] = ""
    default_context_window: int = 8192
    models: tuple[ModelOverride, ...] = ()
    policies: dict[str, Policy] = dataclasses.field(
        default_factory=lambda: {"default": named(Policy(), "default")}
    )
    default_policy: str = "default"
    routes: tuple[Route, ...] = ()
    admin: Admin = Admin()
    compaction_items: CompactionItems = CompactionItems()
    hooks: Hooks = Hooks()
    logging: Logging = Logging()

    def model(self, model: str) -> ModelOverride | None:
        """The first per-model override whose glob matches `model`."""
        for override in self.models:
            if fnmatch.fnmatchcase(model, override.match):
                return override
        return None

    def provider_model(self, upstream: Upstream, model: str) -> str:
        """The model an upstream of kind litellm is asked for: the model override's
        `provider_model`, else the upstream's, `{model}` standing for the request's model
        (e.g. `anthropic/{model}`); the request's model as it is for other kinds."""
        if upstream.kind != "litellm":
            return model
        override = self.model(model)
        template = (override and override.provider_model) or upstream.provider_model
        return template.replace("{model}", model) if template else model

    def default_upstream_for(self, dialect: str) -> str | None:
        """The name of the default upstream of `dialect`, if one is configured."""
        if isinstance(self.default_upstream, str):
            return self.default_upstream or None
        return next((n for d, n in self.default_upstream.items() if d == dialect), None)

    def route(self, dialect: str, model: str, policy_header: str | None) -> tuple[Policy, Upstream]:
        """The policy and upstream for a request in `dialect`: the first matching route whose
        upstream serves the dialect, else the default policy. A route without an upstream,
        like the default, takes the model's upstream, else the dialect's default one.

        NoRoute when the upstream chosen that way cannot serve the dialect.
        """
        override = self.model(model)
        fallback = (override and override.upstream) or self.default_upstream_for(dialect)
        for route in self.routes:
            if not route.matches(dialect, model, policy_header):
                continue
            upstream = self.upstreams.get(route.upstream or fallback or "")
            if upstream is not None and upstream.serves(dialect):
                return self.policies[route.policy], upstream
        if not fallback:
            raise NoRoute(f"no upstream is configured for {dialect} requests")
        upstream = self.upstreams[fallback]
        if not upstream.serves(dialect):
            # Said to the client: the upstream's kind, never its name.
            raise NoRoute(
                f"no upstream serves {dialect} requests for model {model!r}: its upstream is "
                f"of kind {upstream.kind}, which serves {', '.join(upstream.dialects)}"
            )
        return self.policies[self.default_policy], upstream

    def masked(self) -> dict[str, Any]:
        """The resolved config as plain data laid out as in the file, every secret '***'."""
        data = dataclasses.asdict(self)
        for upstream in data["upstreams"].values():
            if upstream["api_key"]:
                upstream["api_key"] = "***"
            if upstream["kind"] != "litellm":
                for key in _LITELLM_ONLY:
                    del upstream[key]
                if upstream["proxy"]:
                    upstream["proxy"] = masked_url(upstream["proxy"])
                continue
            del upstream["proxy"]
            params = upstream["provider_params"]
            for name in SECRET_PROVIDER_PARAMS & params.keys():
                params[name] = "***"
        if data["admin"]["token"]:
            data["admin"]["token"] = "***"  # noqa: S105 (the mask, not a password)
        if data["compaction_items"]["signing_key"]:
            data["compaction_items"]["signing_key"] = "***"
        data["store"]["url"] = masked_url(data["store"]["url"])
        for hook in data["hooks"].values():
            if hook is not None:  # a hook's headers and URL are where its credential goes
                hook["headers"] = dict.fromkeys(hook["headers"], "***")
                hook["url"] = masked_url(hook["url"], mask_path=True)
        for policy in data["policies"].values():
            policy.update(policy.pop("compaction"))
            # A layer is a mapping of its name to its parameters.
            policy["layers"] = [{name: params} for name, params in policy["layers"]]
        return data


def named(obj: Any, name: str) -> Any:
    """`obj` (an Upstream or a Policy) with its name, which is its key in the config."""
    object.__setattr__(obj, "name", name)
    return obj
