"""The compaction engine: pure functions over OpenAI chat messages, no I/O.

A `Policy` says when to compact (its `budget` for a request, whose `status` decides) and how;
`compact` runs its layers over a conversation and returns a `Plan`, a storable rewrite of the
conversation that `render` (or `render_entries`) applies to later requests of the same branch.
"""

from policies.budget import Budget, Status
from policies.chain import Chain, canonical, message_digest
from policies.client_context import is_compaction_request, outside_chain
from policies.context import Context
from policies.conversation import (
    current_turn,
    current_turn_start,
    is_system,
    rounds,
    tool_blocks,
    tool_pair_problems,
)
from policies.counting import Counter, image_tokens, media_tokens
from policies.decision import Decision
from policies.digest import digest
from policies.layers import DEFAULT_LAYERS, LAYERS, Layer, LayerSpec
from policies.layers.clear_tool_results import ClearToolResultsParams
from policies.layers.compress_tool_results import CompressToolResultsParams
from policies.layers.drop_tool_blocks import DropToolBlocksParams
from policies.layers.summarize import SummarizeParams
from policies.layers.trim_head import TrimHeadParams
from policies.layers.truncate_tool_fields import TruncateToolFieldsParams
from policies.message import Message, content_text
from policies.pipeline import Compaction, compact, make_context, run_layer
from policies.plan import HEADINGS, Plan, View, header_message, render, render_entries
from policies.policy import Policy
from policies.prepared import Rolled, roll_prepared
from policies.summary import Summarizer, Summary, SummaryKind, SummaryRequest, too_short

__all__ = [
    "DEFAULT_LAYERS",
    "HEADINGS",
    "LAYERS",
    "Budget",
    "Chain",
    "ClearToolResultsParams",
    "Compaction",
    "CompressToolResultsParams",
    "Context",
    "Counter",
    "Decision",
    "DropToolBlocksParams",
    "Layer",
    "LayerSpec",
    "Message",
    "Plan",
    "Policy",
    "Rolled",
    "Status",
    "SummarizeParams",
    "Summarizer",
    "Summary",
    "SummaryKind",
    "SummaryRequest",
    "TrimHeadParams",
    "TruncateToolFieldsParams",
    "View",
    "canonical",
    "compact",
    "content_text",
    "current_turn",
    "current_turn_start",
    "digest",
    "header_message",
    "image_tokens",
    "is_compaction_request",
    "is_system",
    "make_context",
    "media_tokens",
    "message_digest",
    "outside_chain",
    "render",
    "render_entries",
    "roll_prepared",
    "rounds",
    "run_layer",
    "too_short",
    "tool_blocks",
    "tool_pair_problems",
]
