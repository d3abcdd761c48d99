"""The pipeline: a policy's layers, cheapest first, until the view is at the target."""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass

from policies.anchors import lost_anchors
from policies.budget import Budget
from policies.context import Context, protected_start
from policies.conversation import current_turn, current_turn_start, is_system, tool_blocks
from policies.counting import Counter
from policies.decision import Decision
from policies.draft import Draft
from policies.layers import DEFAULT_LAYERS, LAYERS, LayerSpec
from policies.message import Message, call_name, tool_calls
from policies.plan import Plan, render
from policies.summary import Summarizer

SUMMARY_ROLES = ("user", "system", "developer", "assistant")


@dataclass(frozen=True)
class PolicyParams:
    """A compaction policy: protection, anchors, summary placement and the layers to run."""

    protect_recent_rounds: int = 12
    protect_min_tokens: int = 10_000
    protect_min_text_messages: int = 5
    protect_max_tokens: int = 40_000
    anchors: tuple[str, ...] = ()
    anchor_block_max_tokens: int = 1000
    summary_role: str = "user"
    layers: tuple[LayerSpec, ...] = DEFAULT_LAYERS

    def __post_init__(self) -> None:
        counts = (
            self.protect_recent_rounds,
            self.protect_min_tokens,
            self.protect_min_text_messages,
            self.protect_max_tokens,
            self.anchor_block_max_tokens,
        )
        if min(counts) < 0:
            raise ValueError("protection sizes and the anchor block cap must not be negative")
        if self.summary_role not in SUMMARY_ROLES:
            raise ValueError(f"summary_role must be one of {SUMMARY_ROLES}")
        for name, params in self.layers:
            layer = LAYERS.get(name)
            if layer is None or not isinstance(params, layer.params):
                raise ValueError(f"layer {name!r} with {type(params).__name__} is not a layer")
        for pattern in self.anchors:
            _compiled(pattern)  # raises ValueError early, at configuration time


@dataclass(frozen=True)
class Compaction:
    """The result of `compact`: the new plan, its view and what was done.

    `fits` is tokens_after <= budget.limit; `floor_tokens` is what no layer can remove (fixed
    tokens, the system messages and the current turn), so `floor_tokens > budget.limit`
    means the request cannot fit at all.
    """

    plan: Plan
    view: list[Message]
    decisions: tuple[Decision, ...]
    tokens_before: int
    tokens_after: int
    fits: bool
    anchors_complete: bool
    degraded: bool
    floor_tokens: int


async def compact(
    messages: Sequence[Message],
    plan: Plan,
    *,
    budget: Budget,
    params: PolicyParams,
    counter: Counter,
    fixed_tokens: int = 0,
    summarizer: Summarizer | None = None,
    instructions: str | None = None,
    target_tokens: int | None = None,
    message_tokens: Sequence[int] | None = None,
) -> Compaction:
    """Compact `messages`, starting from `plan`, down to the target (budget's or the given).

    The layers only add to `plan`: its cut and its edits grow, nothing it did is undone.
    """
    ctx = make_context(
        messages,
        params,
        counter=counter,
        budget=budget,
        fixed_tokens=fixed_tokens,
        target_tokens=target_tokens,
        summarizer=summarizer,
        instructions=instructions,
        message_tokens=message_tokens,
    )
    tokens_before = tokens = Draft(messages, plan, ctx).tokens
    decisions: list[Decision] = []
    for name, layer_params in params.layers:
        if tokens <= ctx.target_tokens:
            break
        outcome = LAYERS[name].run(messages, plan, ctx, layer_params)
        plan, made = outcome if isinstance(outcome, tuple) else await outcome
        decisions += made
        tokens = made[-1].tokens_after if made else tokens
    return Compaction(
        plan=plan,
        view=render(messages, plan, summary_role=params.summary_role),
        decisions=tuple(decisions),
        tokens_before=tokens_before,
        tokens_after=tokens,
        fits=tokens <= budget.limit,
        anchors_complete=not lost_anchors(messages, plan, ctx),
        degraded=any(d.detail.startswith("degraded") for d in decisions),
        floor_tokens=ctx.floor_tokens,
    )


def make_context(
    messages: Sequence[Message],
    params: PolicyParams,
    *,
    counter: Counter,
    budget: Budget,
    fixed_tokens: int = 0,
    target_tokens: int | None = None,
    summarizer: Summarizer | None = None,
    instructions: str | None = None,
    message_tokens: Sequence[int] | None = None,
) -> Context:
    """The context the layers of `params` work in for this request.

    `message_tokens`, each message's count, spares counting again what the caller counted.
    """
    if message_tokens is None:
        message_tokens = [counter.message(m) for m in messages]
    counted = list(zip(messages, message_tokens, strict=True))
    chain = tuple(m for m, _ in counted if not is_system(m))
    chain_tokens = tuple(t for m, t in counted if not is_system(m))
    target = budget.target_tokens if target_tokens is None else target_tokens
    turn_start = current_turn_start(chain)
    turn = current_turn(chain)
    task = turn[0] if turn and turn[0] < turn_start else None
    return Context(
        counter=counter,
        chain=chain,
        chain_tokens=chain_tokens,
        system_tokens=sum(t for m, t in counted if is_system(m)),
        fixed_tokens=fixed_tokens,
        target_tokens=target,
        limit_tokens=budget.limit,
        turn_start=turn_start,
        task=task,
        protected_start=protected_start(
            chain,
            chain_tokens,
            turn_start=turn_start,
            rounds=params.protect_recent_rounds,
            min_tokens=params.protect_min_tokens,
            min_text_messages=params.protect_min_text_messages,
            max_tokens=params.protect_max_tokens,
            cap=target // 2,
        ),
        blocks=tuple(tool_blocks(chain)),
        tool_names={str(call.get("id")): call_name(call) for m in chain for call in tool_calls(m)},
        summary_role=params.summary_role,
        anchors=tuple(_compiled(pattern) for pattern in params.anchors),
        # At small windows the anchors must leave room for the rest: at most a fifth of target.
        anchor_block_max_tokens=min(params.anchor_block_max_tokens, target // 5),
        summarizer=summarizer,
        instructions=instructions,
    )


@functools.lru_cache(maxsize=256)
def _compiled(pattern: str) -> re.Pattern[str]:
    try:
        return re.compile(pattern)
    except re.error as error:
        raise ValueError(f"anchor pattern {pattern!r}: {error}") from error
