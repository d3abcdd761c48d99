"""A plan being changed by one layer, with the token count of its view kept up to date.

The pipeline makes a Draft for each layer it runs and turns it into the layer's new plan and
Decision; the layer only changes it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace

from policies.anchors import anchor_block
from policies.client_context import left_out, outside_positions, superseded
from policies.context import Context
from policies.decision import Decision
from policies.message import Message, visible_text
from policies.plan import ANCHOR_HEADING, Plan, applied_edit, header_message, render
from policies.summary import Summary


class Draft:
    """What a layer changes; `outcome` is the new Plan and the Decision.

    Changes only move forward: the cut grows, edits are added or replaced by stronger ones.
    `tokens` is exact for the view except for anchors lost since the last `finish`, which
    are counted as if each went to the anchor block: an upper bound, made exact by `finish`.
    """

    def __init__(self, messages: Sequence[Message], plan: Plan, ctx: Context) -> None:
        self.messages = messages
        self.plan = plan
        self.ctx = ctx
        self.cut = min(plan.cut, len(ctx.chain))
        self.task = plan.task if plan.task is not None and plan.task < self.cut else None
        self.summary = plan.summary
        # Stored edits apply to the messages as they are sent now (fields the chain does not
        # hash may have changed since), so counts and the view are those of what goes out.
        self.edits = {
            p: e if e is None or p >= len(ctx.chain) else applied_edit(e, ctx.chain[p])
            for p, e in plan.edits.items()
        }
        self.levels = dict(plan.levels)
        self.anchor_block = plan.anchor_block
        self.anchor_cap = ctx.anchor_block_max_tokens
        self.changed: list[int] = []
        self._touched = False
        self._body = (
            sum(ctx.chain_tokens[self.cut :])
            + self.tokens_at(self.task)
            + sum(
                ctx.message_tokens(p, edit) - ctx.chain_tokens[p]
                for p, edit in self.edits.items()
                if self.cut <= p < len(ctx.chain)
            )
        )
        self.header = self.header_cost(self.summary)
        # Superseded copies of system messages and client context, and their tokens: the
        # view leaves out those the plan displaces (`policies.client_context.left_out`).
        outside = outside_positions(messages)
        copies = superseded(messages, outside, max(plan.covered, len(ctx.chain)))
        self._copies = copies
        self._copy_tokens = {i: ctx.counter.message(messages[i]) for i in copies}
        self._lost: dict[str, None] = {}
        self._lost_tokens = 0
        self.tokens_before = self.tokens

    @property
    def tokens(self) -> int:
        """Tokens of the view: fixed, system messages, header and the kept chain."""
        lost = 0
        if self._lost:
            heading = 0 if self.anchor_block else self.ctx.counter.text(ANCHOR_HEADING) + 2
            lost = min(self._lost_tokens, self.anchor_cap) + heading
        system = self.ctx.system_tokens
        if self._copies:
            left = left_out(self._copies, self.cut, self.edits)
            system -= sum(self._copy_tokens[i] for i in left)
        return self.ctx.fixed_tokens + system + self.header + self._body + lost

    def over(self, goal: int | None = None) -> bool:
        return self.tokens > (self.ctx.aim_tokens if goal is None else goal)

    def current(self, position: int) -> Message | None:
        """The message at `position` as the view shows it (None when evicted or dropped)."""
        if position < self.cut:
            return self.ctx.chain[position] if position == self.task else None
        return self.edits.get(position, self.ctx.chain[position])

    def tokens_at(self, position: int | None) -> int:
        if position is None:
            return 0
        return self.ctx.message_tokens(position, self.current(position))

    def task_after(self, cut: int) -> int | None:
        """The task the view keeps verbatim once the chain before `cut` is evicted: the
        current one, when the cut passes it (a summary of an agent loop's rounds), else the
        one kept so far."""
        task = self.ctx.task
        return task if task is not None and self.cut <= task < cut else self.task

    def evicted(self, cut: int) -> list[int]:
        """The positions that evicting the chain before `cut` removes from the view: those
        from the current cut on but the task kept, and a task kept so far that no longer is."""
        kept = self.task_after(cut)
        earlier = [self.task] if self.task is not None and self.task != kept else []
        return [*earlier, *(p for p in range(self.cut, cut) if p != kept)]

    def candidates(self, positions: Iterable[int]) -> list[tuple[int, Message]]:
        """The messages at `positions` that are neither in the current turn nor gone."""
        found = ((p, self.current(p)) for p in positions if not self.ctx.in_turn(p))
        return [(p, message) for p, message in found if message is not None]

    def set(self, position: int, message: Message | None, level: int | None = None) -> None:
        """Replace the message at `position` (None drops it); `level` is that of a compressed
        tool output."""
        self._body += self.ctx.message_tokens(position, message) - self.tokens_at(position)
        self.edits[position] = message
        if level is None:
            self.levels.pop(position, None)
        else:
            self.levels[position] = level
        self.changed.append(position)
        still = visible_text(message) if message is not None else ""
        self._lose(position, still, salient=level is None)

    def evict(self, cut: int, summary: Summary | None) -> None:
        """Replace the chain before `cut`, but the task kept (`task_after`), by `summary`."""
        kept = self.task_after(cut)
        for position in self.evicted(cut):
            self._body -= self.tokens_at(position)
            self._lose(position, summary.shown if summary is not None else "")
            self.changed.append(position)
        self.cut, self.task = cut, kept
        self.set_summary(summary)

    def set_summary(self, summary: Summary | None) -> None:
        self.summary = summary
        self.header = self.header_cost(self.summary)
        self._touched = True

    def finish(self) -> Plan:
        """The plan, with the anchor block made from the anchors its view lost."""
        plan = Plan(
            cut=self.cut,
            summary=self.summary,
            edits={p: e for p, e in self.edits.items() if p >= self.cut},
            covered=max(self.plan.covered, len(self.ctx.chain)),
            levels={p: level for p, level in self.levels.items() if p >= self.cut},
            task=self.task,
        )
        lost = lost_anchors(self.messages, plan, self.ctx)
        self.anchor_block = anchor_block(lost, self.anchor_cap, self.ctx.counter)
        self.header = self.header_cost(self.summary)
        self._lost.clear()
        self._lost_tokens = 0
        return replace(plan, anchor_block=self.anchor_block)

    def cap_anchors(self, tokens: int) -> None:
        """Allow the anchor block only `tokens` tokens: fitting wins over anchors."""
        self.anchor_cap = min(self.anchor_cap, tokens)
        self._touched = True

    def outcome(self, layer: str, detail: str = "") -> tuple[Plan, Decision | None]:
        """The new plan and the decision, or the given plan and None when nothing changed."""
        if not self.changed and not self._touched:
            return self.plan, None
        plan = self.finish()
        positions = tuple(sorted(set(self.changed)))
        return plan, Decision(layer, positions, self.tokens_before, self.tokens, detail)

    def header_cost(self, summary: Summary | None) -> int:
        """Tokens of the header message with `summary` and the current anchor block."""
        header = header_message(summary, self.anchor_block, self.ctx.summary_role)
        return 0 if header is None else self.ctx.counter.message(header)

    def _lose(self, position: int, still_visible: str, *, salient: bool = True) -> None:
        for anchor in self.ctx.anchor_matches(position, salient=salient):
            if anchor in self._lost or anchor in still_visible:
                continue
            if self.anchor_block is not None and anchor in self.anchor_block.split("\n"):
                continue
            self._lost[anchor] = None
            self._lost_tokens += self.ctx.counter.text(anchor) + 1


def lost_anchors(
    messages: Sequence[Message], plan: Plan, ctx: Context, *, salient: bool = True
) -> list[str]:
    """Anchors (and, with `salient`, salient lines of tool outputs) of the messages `plan`
    evicts or edits that its view does not show."""
    end = len(ctx.chain)
    changed = [*range(min(plan.cut, end)), *sorted(p for p in plan.edits if plan.cut <= p < end)]
    needed = dict.fromkeys(
        anchor
        for p in changed
        for anchor in ctx.anchor_matches(p, salient=salient and p not in plan.levels)
    )
    if not needed:
        return []
    view = "\n".join(visible_text(m) for m in render(messages, plan, summary_role=ctx.summary_role))
    return [anchor for anchor in needed if anchor not in view]
