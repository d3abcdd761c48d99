"""The compaction layers, cheapest first, and their registry for configuration.

A layer is `async def layer(draft: Draft, params: P) -> str`: it changes the draft of the
plan (the pipeline makes the draft and turns it into the new plan and a Decision) and returns
what the decision should say, "" when there is nothing to say. `params` is the layer's frozen
dataclass, whose fields are what a policy may configure. A policy's layers are LayerSpecs,
(name, params) pairs.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, NamedTuple, TypeVar

from policies.draft import Draft
from policies.layers.clear_tool_results import ClearToolResultsParams, clear_tool_results
from policies.layers.compress_tool_results import (
    CompressToolResultsParams,
    compress_tool_results,
)
from policies.layers.drop_tool_blocks import DropToolBlocksParams, drop_tool_blocks
from policies.layers.summarize import SummarizeParams, summarize
from policies.layers.trim_head import TrimHeadParams, trim_head
from policies.layers.truncate_tool_fields import TruncateToolFieldsParams, truncate_tool_fields

P = TypeVar("P")


@dataclass(frozen=True)
class Layer(Generic[P]):
    """A registered layer: its function and the dataclass of its parameters."""

    run: Callable[[Draft, P], Awaitable[str]]
    params: type[P]


class LayerSpec(NamedTuple):
    """One configured step of a policy: a layer's name and its parameters."""

    name: str
    params: Any


LAYERS: Mapping[str, Layer[Any]] = {
    "compress_tool_results": Layer(compress_tool_results, CompressToolResultsParams),
    "clear_tool_results": Layer(clear_tool_results, ClearToolResultsParams),
    "truncate_tool_fields": Layer(truncate_tool_fields, TruncateToolFieldsParams),
    "drop_tool_blocks": Layer(drop_tool_blocks, DropToolBlocksParams),
    "summarize": Layer(summarize, SummarizeParams),
    "trim_head": Layer(trim_head, TrimHeadParams),
}

DEFAULT_LAYERS = tuple(LayerSpec(name, layer.params()) for name, layer in LAYERS.items())
