"""Turning plain YAML data into typed, frozen dataclasses, with errors that name the key.

One converter serves every section of the config (and the engine's `policies.Policy` and
layer parameters): it reads the dataclass fields and their type hints, so a new setting is a
new field with a default, and nothing else. A field with `metadata={"flat": True}` holds a
dataclass whose keys sit in the parent's mapping (a policy's compaction keys, say).
"""

from __future__ import annotations

import dataclasses
import os
import re
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, Literal, TypeVar

import yaml

from proxy.errors import ProxyError

T = TypeVar("T")
Path = tuple[str | int, ...]

_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


class ConfigError(ProxyError):
    """The configuration is invalid; `problems` lists every finding, one line each."""

    def __init__(self, problems: list[str]):
        super().__init__("invalid configuration:\n" + "\n".join(f"  - {p}" for p in problems))
        self.problems = problems


@dataclasses.dataclass
class Source:
    """Where values came from: the line of every key path, and the problems found so far."""

    name: str = "<config>"
    lines: dict[Path, int] = dataclasses.field(default_factory=dict)
    problems: list[str] = dataclasses.field(default_factory=list)

    def problem(self, path: Path, message: str) -> None:
        where = dotted(path) or "(top level)"
        line = self.lines.get(path)
        at = f" ({self.name}, line {line})" if line else ""
        self.problems.append(f"{where}{at}: {message}")


def dotted(path: Path) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


def load_yaml(text: str, source: Source) -> Any:
    """Parse YAML with the safe loader only, and note the line of every key."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        # PyYAML names a string it parsed "<unicode string>": name the file instead.
        for mark in (getattr(exc, "context_mark", None), getattr(exc, "problem_mark", None)):
            if mark is not None:
                mark.name = source.name
        raise ConfigError([f"{source.name}: not valid YAML: {exc}"]) from None
    if node is not None:
        _note_lines(node, (), source.lines)
    return data


def _note_lines(node: yaml.Node, path: Path, lines: dict[Path, int]) -> None:
    lines[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            child = (*path, str(key.value))
            _note_lines(value, child, lines)
            lines[child] = key.start_mark.line + 1
    elif isinstance(node, yaml.SequenceNode):
        for i, value in enumerate(node.value):
            _note_lines(value, (*path, i), lines)


def interpolate(value: str, path: Path, source: Source) -> str:
    """Replace `${VAR}` / `${VAR:-default}` with the environment's value."""

    def sub(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        found = os.environ.get(name, default)
        if found is None:
            source.problem(path, f"environment variable {name} is not set")
            return ""
        return found

    return _ENV.sub(sub, value)


Hook = Callable[[Any, Path, Source], Any]


def build(cls: type[T], data: Any, path: Path, source: Source, hooks: Mapping[str, Hook]) -> T:
    """Build dataclass `cls` from a mapping; unknown keys, bad values and the ValueError of
    its constructor (the rules it checks itself) become problems at `path`.

    `hooks` maps a field name to a custom converter, for the few fields whose type alone
    does not say how to read them.
    """
    known_problems = len(source.problems)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        source.problem(path, f"expected a mapping, got {_kind(data)}")
        data = {}
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    flat = {name: hints[name] for name, f in fields.items() if f.metadata.get("flat")}
    owner = {key: name for name, hint in flat.items() for key in _keys(hint)}
    known = _keys(cls) - set(flat) | set(owner)
    for key in data:
        if key not in known:
            listed = ", ".join(sorted(known))
            source.problem((*path, str(key)), f"unknown key (known keys: {listed})")
    values: dict[str, Any] = {}
    for name, hint in flat.items():
        own = {key: value for key, value in data.items() if owner.get(key) == name}
        values[name] = build(hint, own, path, source, hooks)
    for name, field in fields.items():
        if not field.init or name not in data or name in flat:
            continue
        sub = (*path, name)
        if name in hooks:
            values[name] = hooks[name](data[name], sub, source)
        else:
            values[name] = convert(hints[name], data[name], sub, source, hooks)
    missing = [
        n
        for n, f in fields.items()
        if f.init
        and n not in values
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    ]
    for name in missing:
        if name not in data:
            source.problem((*path, name), "is required")
    if len(source.problems) > known_problems:
        # Some of its values are broken: defaults stand in for them, so that every other
        # problem is still reported in this run, but its own rules are not judged on them.
        try:
            return cls(**values)
        except Exception:
            return typing.cast(T, None)
    try:
        return cls(**values)
    except (TypeError, ValueError) as exc:
        source.problem(path, str(exc))
        return typing.cast(T, None)


def convert(hint: Any, value: Any, path: Path, source: Source, hooks: Mapping[str, Hook]) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        if len(options) == 1:
            return convert(options[0], value, path, source, hooks)
        # The option of the value's shape, so that its own problems are the ones reported.
        for option in options:
            if isinstance(value, _shape(option)):
                return convert(option, value, path, source, hooks)
        source.problem(path, f"expected {_hint_name(hint)}, got {_kind(value)}")
        return None
    if origin is Literal:
        if value not in args:
            choices = ", ".join(repr(a) for a in args)
            source.problem(path, f"must be one of {choices}, got {value!r}")
        return value
    if origin is tuple:
        if not isinstance(value, list):
            source.problem(path, f"expected a list, got {_kind(value)}")
            return ()
        item = args[0]
        return tuple(convert(item, v, (*path, i), source, hooks) for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict):
            source.problem(path, f"expected a mapping, got {_kind(value)}")
            return {}
        if typing.get_origin(args[0]) is Literal:
            for key in value:
                convert(args[0], key, (*path, str(key)), source, hooks)
        return {
            str(k): convert(args[1], v, (*path, str(k)), source, hooks) for k, v in value.items()
        }
    if dataclasses.is_dataclass(hint):
        return build(typing.cast(type[Any], hint), value, path, source, hooks)
    if hint is bool:
        if not isinstance(value, bool):
            source.problem(path, f"expected true or false, got {_kind(value)}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            source.problem(path, f"expected an integer, got {_kind(value)}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            source.problem(path, f"expected a number, got {_kind(value)}")
            return value
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            source.problem(path, f"expected a string, got {_kind(value)}")
            return value
        return interpolate(value, path, source)
    if hint is Any:
        return value
    raise TypeError(f"config decoder: no converter for {hint!r}")


def _keys(cls: Any) -> set[str]:
    """The keys a dataclass reads: its fields that are set through its constructor."""
    return {f.name for f in dataclasses.fields(cls) if f.init}


def _shape(hint: Any) -> type | tuple[type, ...]:
    """The Python type(s) of YAML data that `hint` is read from."""
    origin = typing.get_origin(hint) or hint
    if origin is dict or dataclasses.is_dataclass(origin):
        return dict
    shapes: dict[Any, type | tuple[type, ...]] = {tuple: list, float: (int, float)}
    return shapes.get(origin, origin if isinstance(origin, type) else object)


def _kind(value: Any) -> str:
    if value is None:
        return "nothing (null)"
    names = {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean"}
    return names.get(type(value), f"{type(value).__name__} {value!r}")


def _hint_name(hint: Any) -> str:
    names: dict[object, str] = {dict: "a mapping", list: "a list", str: "a string"}
    names |= {int: "an integer", (int, float): "a number", bool: "true or false"}
    shapes = [_shape(a) for a in typing.get_args(hint) if a is not type(None)]
    return " or ".join(names.get(shape, str(shape)) for shape in shapes)
