"""The compaction layers, cheapest first, and their registry for configuration.

A layer is a function `(messages, plan, ctx, params) -> (plan, decisions)` (summarize
awaits its summarizer, so it is a coroutine function); `params` is the layer's frozen
dataclass, whose fields are what a policy may configure. A policy's layers are LayerSpecs,
(name, params) pairs.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
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
