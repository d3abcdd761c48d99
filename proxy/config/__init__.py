"""The proxy's configuration: read from YAML, validated once at start-up, then plain data.

`schema` holds the typed objects (and how a request is routed), `decoder` reads YAML into
them with errors that name the key and its line, `checks` holds the rules no type can say.
Every key is documented in docs/config.md. Secrets come from the environment through `${VAR}`
interpolation; `Config.masked()` gives a copy that is safe to print.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path as FilePath
from typing import Any

import policies
from proxy.config.checks import check
from proxy.config.decoder import ConfigError, Path, Source, build, load_yaml
from proxy.config.provider_params import PROVIDER_PARAMS, SECRET_PROVIDER_PARAMS
from proxy.config.retrieval import Retrieval, StoredOriginals
from proxy.config.schema import (
    DIALECTS,
    DIALECTS_BY_KIND,
    Admin,
    Auth,
    CompactionItems,
    Config,
    Dashboard,
    Dialect,
    ExactCount,
    Hook,
    Hooks,
    InboundKey,
    Kind,
    Listen,
    Logging,
    ModelOverride,
    NoRoute,
    Policy,
    Route,
    Sessions,
    Store,
    Summarizer,
    Timeouts,
    Upstream,
    named,
)

DEFAULT_CONFIG = FilePath(__file__).resolve().parents[2] / "config.yaml"

__all__ = [
    "DEFAULT_CONFIG",
    "DIALECTS",
    "DIALECTS_BY_KIND",
    "PROVIDER_PARAMS",
    "SECRET_PROVIDER_PARAMS",
    "Admin",
    "Auth",
    "CompactionItems",
    "Config",
    "ConfigError",
    "Dashboard",
    "Dialect",
    "ExactCount",
    "Hook",
    "Hooks",
    "InboundKey",
    "Kind",
    "Listen",
    "Logging",
    "ModelOverride",
    "NoRoute",
    "Policy",
    "Retrieval",
    "Route",
    "Sessions",
    "Store",
    "StoredOriginals",
    "Summarizer",
    "Timeouts",
    "Upstream",
    "load",
    "loads",
]


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
    return _parse(data, source)


def loads(text: str, name: str = "<config>") -> Config:
    """Like `load`, from a string (tests, embedded defaults)."""
    source = Source(name=name)
    return _parse(load_yaml(text, source), source)


def _parse(data: Any, source: Source) -> Config:
    config = build(Config, data, (), source, {"layers": _read_layers})
    if source.problems or config is None:
        raise ConfigError(source.problems)
    for name, upstream in config.upstreams.items():
        named(upstream, name)
    for name, policy in config.policies.items():
        named(policy, name)
    if not config.default_upstream and len(config.upstreams) == 1:
        # A single upstream needs no naming.
        config = dataclasses.replace(config, default_upstream=next(iter(config.upstreams)))
    check(config, source)
    if source.problems:
        raise ConfigError(source.problems)
    return config


def _read_layers(data: Any, path: Path, source: Source) -> tuple[policies.LayerSpec, ...]:
    """A policy's `layers`: each a layer's name, or a mapping of its name to its parameters."""
    if not isinstance(data, list):
        source.problem(path, "expected a list of layers")
        return ()
    specs = []
    for i, item in enumerate(data):
        where = (*path, i)
        params: Any = {}
        if isinstance(item, str):
            name = item
        elif isinstance(item, dict) and len(item) == 1:
            ((name, params),) = item.items()
        else:
            source.problem(where, "a layer is its name, or a mapping of its name to its parameters")
            continue
        layer = policies.LAYERS.get(str(name))
        if layer is None:
            known = ", ".join(policies.LAYERS)
            source.problem(where, f"unknown layer {name!r} (known layers: {known})")
            continue
        built = build(layer.params, params, (*where, str(name)), source, {})
        if built is not None:
            specs.append(policies.LayerSpec(str(name), built))
    return tuple(specs)
