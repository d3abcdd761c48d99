"""The compaction layers, cheapest first, and their registry for configuration.

A layer is a function `(messages, plan, ctx, params) -> (plan, decisions)` (summarize
awaits its summarizer, so it is a coroutine function); `params` is the layer's frozen
dataclass, whose fields are what a policy may configure. A policy's layers are LayerSpecs,
(name, params) pairs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from policies.decision import Decision
from policies.layers.clear_tool_results import ClearToolResultsParams, clear_tool_results
from policies.layers.drop_tool_blocks import DropToolBlocksParams, drop_tool_blocks
from policies.layers.summarize import SummarizeParams, summarize
from policies.layers.trim_head import TrimHeadParams, trim_head
from policies.layers.truncate_tool_fields import TruncateToolFieldsParams, truncate_tool_fields
from policies.plan import Plan

Outcome = tuple[Plan, list[Decision]]


@dataclass(frozen=True)
class Layer:
    """A registered layer: its function and the dataclass of its parameters."""

    run: Callable[..., Outcome | Awaitable[Outcome]]
    params: type[Any]


class LayerSpec(NamedTuple):
    """One configured step of a policy: a layer's name and its parameters."""

    name: str
    params: Any


LAYERS: Mapping[str, Layer] = {
    "clear_tool_results": Layer(clear_tool_results, ClearToolResultsParams),
    "truncate_tool_fields": Layer(truncate_tool_fields, TruncateToolFieldsParams),
    "drop_tool_blocks": Layer(drop_tool_blocks, DropToolBlocksParams),
    "summarize": Layer(summarize, SummarizeParams),
    "trim_head": Layer(trim_head, TrimHeadParams),
}

DEFAULT_LAYERS = tuple(LayerSpec(name, layer.params()) for name, layer in LAYERS.items())


def parse_layers(config: Sequence[str | Mapping[str, Any]]) -> tuple[LayerSpec, ...]:
    """Layers from configuration: `["trim_head", {"clear_tool_results": {"keep_last": 3}}]`.

    Raises ValueError naming the unknown layer or field, or the invalid value.
    """
    layers = []
    for item in config:
        if isinstance(item, str):
            item = {item: {}}
        if not isinstance(item, Mapping) or len(item) != 1:
            raise ValueError(f"a layer is a name or a one-key mapping, not {item!r}")
        ((name, fields),) = item.items()
        layer = LAYERS.get(name)
        if layer is None:
            raise ValueError(f"unknown layer {name!r}; known: {', '.join(LAYERS)}")
        known = {field.name: field for field in dataclasses.fields(layer.params)}
        unknown = sorted(set(fields or {}) - set(known))
        if unknown:
            raise ValueError(f"layer {name}: unknown fields {unknown}; known: {sorted(known)}")
        values = {k: _checked(name, known[k], v) for k, v in (fields or {}).items()}
        try:
            layers.append(LayerSpec(name, layer.params(**values)))
        except ValueError as error:
            raise ValueError(f"layer {name}: {error}") from error
    return tuple(layers)


def _checked(layer: str, field: dataclasses.Field[Any], value: object) -> object:
    """The value in the type of the field's default (lists become tuples)."""
    value = tuple(value) if isinstance(value, list) else value
    default = field.default
    if default is None or default is dataclasses.MISSING:
        return value
    kinds: tuple[type, ...] = (int, float) if isinstance(default, float) else (type(default),)
    if isinstance(value, bool) != isinstance(default, bool) or not isinstance(value, kinds):
        raise ValueError(f"layer {layer}: {field.name} must be {type(default).__name__}")
    return value
