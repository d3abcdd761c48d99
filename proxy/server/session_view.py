"""One session as the dashboard shows it: its turns, its current plan in words, the text the
model now sees in place of what was compacted, the summary prepared ahead, the decisions.

The only text shown is what the admin API's inspect shows of a session (its summary, its
anchors, its prepared summary): the proxy keeps no messages.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import policies
from policies.plan import header_message
from proxy.sessions.activity import Activity
from proxy.sessions.state import Branch, SessionState

# What each layer did to the messages it edited or dropped (a layer not named here, by name).
LAYER_WORDS = {
    "clear_tool_results": "Cleared: {n} old tool results or media replaced by a placeholder.",
    "truncate_tool_fields": "Compressed: {n} tool calls or results with long fields cut.",
    "drop_tool_blocks": "Dropped: {n} old tool calls with their results.",
    "trim_head": "Dropped: {n} of the oldest messages.",
}


def session_view(
    key: str, version: int, state: SessionState, activity: Activity | None
) -> dict[str, Any]:
    """The session's JSON for the dashboard's page."""
    branch = current(state.branches)
    plan = branch.plan if branch else policies.Plan()
    header = header_message(plan.summary, plan.anchor_block)
    prepared = state.prepared
    turns = [t.to_list() for t in activity.recent] if activity else []
    return {
        "key": key,
        "version": version,
        "activity": None
        if activity is None
        else {**activity.who._asdict(), **dataclasses.asdict(activity.counts), "recent": turns},
        "prompt_cache": state.prompt_cache.to_dict() if state.prompt_cache else None,
        "branches": len(state.branches),
        "plan": plan_words(plan, state.decisions),
        "seen": None if header is None else header["content"],
        "prepared": None
        if prepared is None
        else {"start": prepared.start, "end": prepared.end, "text": prepared.text},
        "pending": state.pending,
        "decisions": [_decision(d) for d in reversed(state.decisions)],
    }


def current(branches: Sequence[Branch]) -> Branch | None:
    """The branch compacted last: the one the session's newest turns replay."""
    return max(branches, key=lambda branch: branch.used, default=None)


def plan_words(plan: policies.Plan, decisions: Sequence[dict[str, Any]]) -> list[str]:
    """The plan in plain sentences: what was summarised, cleared, compressed, dropped, and
    which anchors are pinned. Each edit is put down to the last decision that touched it."""
    if plan == policies.Plan():
        return ["No compaction yet: the requests go upstream as the client sends them."]
    words = []
    if plan.summary is not None:
        kind = (
            "an LLM summary"
            if plan.summary.kind == "llm"
            else "a mechanical digest (no LLM summary was ready in time)"
        )
        size = len(plan.summary.shown.split())
        kept = "" if plan.task is None else f" but the task (message {plan.task + 1}, kept)"
        words.append(
            f"Summarised: the first {plan.cut} messages after the system prompt{kept}, "
            f"as {kind} of {size:,} words."
        )
    by_layer: dict[str, int] = {}
    dropped = 0
    owner = {p: str(d.get("layer")) for d in decisions for p in d.get("positions") or ()}
    for position, edit in sorted(plan.edits.items()):
        layer = owner.get(position, "")
        if layer in LAYER_WORDS or edit is not None:
            by_layer[layer] = by_layer.get(layer, 0) + 1
        else:
            dropped += 1
    for layer, n in sorted(by_layer.items()):
        template = LAYER_WORDS.get(layer)
        by = layer or "an earlier plan"
        words.append(template.format(n=n) if template else f"Edited by {by}: {n} messages.")
    if dropped:
        words.append(f"Dropped: {dropped} messages.")
    if plan.anchor_block:
        anchors = plan.anchor_block.split("\n")
        cut = " (some did not fit: the anchor block is full)" if plan.anchors_truncated else ""
        words.append(f"Pinned: {len(anchors)} anchors kept verbatim from removed messages{cut}.")
    words.append(
        f"The plan covers the first {plan.covered} messages; later ones go as the client sent them."
    )
    return words


def _decision(record: dict[str, Any]) -> dict[str, Any]:
    """A decision as the log shows it: how many messages it touched, not which."""
    positions = record.get("positions") or ()
    return {**{k: v for k, v in record.items() if k != "positions"}, "messages": len(positions)}
