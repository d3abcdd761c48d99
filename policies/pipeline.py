"""The pipeline: a policy's layers, cheapest first, until the view is at the target."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from policies.anchors import anchor_pattern
from policies.budget import Budget
from policies.client_context import outside_chain
from policies.context import Context, protected_start, turn_growth
from policies.conversation import current_turn, current_turn_start, tool_blocks
from policies.counting import Counter
from policies.decision import Decision
from policies.draft import Draft, lost_anchors
from policies.layers import LAYERS, LayerSpec
from policies.message import Message, call_name, tool_calls
from policies.plan import Plan, render
from policies.policy import Policy
from policies.summary import Summarizer


@dataclass(frozen=True)
class Compaction:
    """The result of `compact`: the new plan, its view and what was done.

    `fits` is tokens_after <= budget.limit; `floor_tokens` is what no layer can remove (fixed
    tokens, the system messages and the current turn), so `floor_tokens > budget.limit`
    means the request cannot fit at all. `short`: the view is left without room for the
    turns the policy wants before the next compaction (`Policy.short`; for a given target,
    at the compact level), so the next compaction waits for the limit.
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
    short: bool


async def compact(
    messages: Sequence[Message],
    plan: Plan,
    *,
    budget: Budget,
    policy: Policy,
    counter: Counter,
    fixed_tokens: int = 0,
    summarizer: Summarizer | None = None,
    instructions: str | None = None,
    target_tokens: int | None = None,
    ahead_tokens: int = 0,
    message_tokens: Sequence[int] | None = None,
) -> Compaction:
    """Compact `messages`, starting from `plan`, down to the policy's aim for this
    conversation (`Policy.aim`), or to the given target; with `ahead_tokens`, as if the
    conversation had already grown by that much.

    The layers only add to `plan`: its cut and its edits grow, nothing it did is undone.
    """
    ctx = make_context(
        messages,
        policy,
        counter=counter,
        budget=budget,
        fixed_tokens=fixed_tokens,
        target_tokens=target_tokens,
        ahead_tokens=ahead_tokens,
        summarizer=summarizer,
        instructions=instructions,
        message_tokens=message_tokens,
    )
    tokens_before = tokens = Draft(messages, plan, ctx).tokens
    decisions: list[Decision] = []
    for spec in policy.layers:
        if tokens <= ctx.aim_tokens:
            break
        changed, decision = await run_layer(spec, messages, plan, ctx)
        # A layer that does not make the view smaller (a summary header outweighing the few
        # tokens it would replace) is no step towards the target: its change is dropped.
        if decision is not None and decision.tokens_after < tokens:
            plan = changed
            decisions.append(decision)
            tokens = decision.tokens_after
    # Salient lines are kept as far as their share allows: only configured anchors that did
    # not fit are reported.
    truncated = bool(lost_anchors(messages, plan, ctx, salient=False))
    if truncated != plan.anchors_truncated:
        plan = replace(plan, anchors_truncated=truncated)
    if target_tokens is None:
        growth = turn_growth(ctx.chain_tokens, ctx.chain)
        short = policy.short(budget, growth, tokens)
    else:
        short = tokens >= budget.compact_tokens
    return Compaction(
        plan=plan,
        view=render(messages, plan, summary_role=policy.summary_role),
        decisions=tuple(decisions),
        tokens_before=tokens_before,
        tokens_after=tokens,
        fits=tokens <= budget.limit,
        anchors_complete=not truncated,
        degraded=any(d.detail.startswith("degraded") for d in decisions),
        floor_tokens=ctx.floor_tokens,
        short=short,
    )


async def run_layer(
    spec: LayerSpec, messages: Sequence[Message], plan: Plan, ctx: Context
) -> tuple[Plan, Decision | None]:
    """One layer over `plan`: the new plan and what the layer did, or `plan` itself and None
    when it changed nothing."""
    draft = Draft(messages, plan, ctx)
    detail = await LAYERS[spec.name].run(draft, spec.params)
    return draft.outcome(spec.name, detail)


def make_context(
    messages: Sequence[Message],
    policy: Policy,
    *,
    counter: Counter,
    budget: Budget,
    fixed_tokens: int = 0,
    target_tokens: int | None = None,
    ahead_tokens: int = 0,
    summarizer: Summarizer | None = None,
    instructions: str | None = None,
    message_tokens: Sequence[int] | None = None,
) -> Context:
    """The context the layers of `policy` work in for this request (see `compact`).

    `message_tokens`, each message's count, spares counting again what the caller counted.
    """
    if message_tokens is None:
        message_tokens = [counter.message(m) for m in messages]
    inside = [not outside_chain(m) for m in messages]
    counted = list(zip(messages, message_tokens, inside, strict=True))
    chain = tuple(m for m, _, kept in counted if kept)
    chain_tokens = tuple(t for _, t, kept in counted if kept)
    if target_tokens is None:
        target = budget.target_tokens
        aim = policy.aim(budget, turn_growth(chain_tokens, chain))
    else:
        target = aim = target_tokens
    target, aim = max(1, target - ahead_tokens), max(1, aim - ahead_tokens)
    turn_start = current_turn_start(chain)
    turn = current_turn(chain)
    task = turn[0] if turn and turn[0] < turn_start else None
    return Context(
        counter=counter,
        chain=chain,
        chain_tokens=chain_tokens,
        system_tokens=sum(message_tokens) - sum(chain_tokens),
        fixed_tokens=fixed_tokens,
        target_tokens=target,
        aim_tokens=aim,
        limit_tokens=budget.limit,
        turn_start=turn_start,
        task=task,
        protected_start=protected_start(
            chain,
            chain_tokens,
            turn_start=turn_start,
            rounds=policy.protect_recent_rounds,
            min_tokens=policy.protect_min_tokens,
            min_text_messages=policy.protect_min_text_messages,
            max_tokens=policy.protect_max_tokens,
            cap=target // 2,
        ),
        blocks=tuple(tool_blocks(chain)),
        tool_names={str(call.get("id")): call_name(call) for m in chain for call in tool_calls(m)},
        summary_role=policy.summary_role,
        anchors=tuple(anchor_pattern(pattern) for pattern in policy.anchors),
        # At small windows the anchors must leave room for the rest: at most a fifth of target.
        anchor_block_max_tokens=min(policy.anchor_block_max_tokens, target // 5),
        summarizer=summarizer,
        instructions=instructions,
    )
