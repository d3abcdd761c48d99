"""The plan: a sticky, storable rewrite of one branch of a session's history, and its view."""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, overload

from policies.client_context import left_out, outside_positions, superseded
from policies.message import Message, call_arguments, call_function
from policies.summary import Summary

SUMMARY_HEADING = (
    "[Summary of the earlier conversation. The original messages were replaced by this "
    "summary to fit the context window.]"
)
DIGEST_HEADING = (
    "[Digest of the earlier conversation, extracted mechanically. The original messages "
    "were removed to fit the context window.]"
)
ANCHOR_HEADING = "[Kept verbatim from removed messages:]"
# How each message the engine writes begins (the header of a compacted view).
HEADINGS = (SUMMARY_HEADING, DIGEST_HEADING, ANCHOR_HEADING)


@dataclass(frozen=True)
class Plan:
    """How one branch of a conversation is rewritten, by chain position.

    Chain positions index the non-system messages. Positions before `cut` are replaced by
    `summary`; `edits` replace (or, with None, drop) later messages; `levels` is the
    compression level of each edit that is a compressed tool output (so that the next
    compaction goes on from it); `task` is a position before `cut` shown verbatim all the
    same, before the summary: the task of an agent loop whose tool rounds the summary stands
    for; `covered` is how many chain positions the plan was computed over;
    `anchors_truncated` says that its view lacks anchors of what it removed (they did not
    fit their cap), so that every response built from it says so. The empty plan changes
    nothing.
    """

    cut: int = 0
    summary: Summary | None = None
    edits: Mapping[int, Message | None] = field(default_factory=dict)
    anchor_block: str | None = None
    covered: int = 0
    anchors_truncated: bool = False
    levels: Mapping[int, int] = field(default_factory=dict)
    task: int | None = None

    @cached_property
    def _runs(self) -> dict[tuple[int, ...], list[tuple[int, int, Message | None]]]:
        """What `_edited_runs` made of this plan (a session's turns between compactions
        replay the same plan object)."""
        return {}

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able form (edit keys become strings). `task` only when there is one: a plan
        without it is stored as the versions before it stored plans."""
        task = {} if self.task is None else {"task": self.task}
        return {
            "cut": self.cut,
            "summary": None if self.summary is None else _summary_dict(self.summary),
            "edits": {str(position): edit for position, edit in self.edits.items()},
            "anchor_block": self.anchor_block,
            "covered": self.covered,
            "anchors_truncated": self.anchors_truncated,
            "levels": {str(position): level for position, level in self.levels.items()},
            **task,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Plan:
        """The plan of `to_dict`; ValueError when the data is not one."""
        try:
            summary = data["summary"]
            plan = cls(
                cut=int(data["cut"]),
                summary=None if summary is None else _summary_of(summary),
                edits={int(k): v for k, v in data["edits"].items()},
                anchor_block=data["anchor_block"],
                covered=int(data["covered"]),
                # Absent from plans stored before they were recorded.
                anchors_truncated=data.get("anchors_truncated", False),
                levels={int(k): v for k, v in data.get("levels", {}).items()},
                # Absent from plans that keep no task, and from those of earlier versions.
                task=data.get("task"),
            )
        except (KeyError, TypeError, AttributeError) as error:
            raise ValueError(f"not a plan: {error!r}") from error
        if plan.cut < 0 or plan.covered < 0 or any(p < 0 for p in plan.edits):
            raise ValueError("not a plan: a negative position")
        if plan.task is not None and not (type(plan.task) is int and 0 <= plan.task < plan.cut):
            raise ValueError("not a plan: the task is not a position before the cut")
        if plan.summary is not None and plan.summary.kind not in ("llm", "digest"):
            raise ValueError(f"not a plan: summary kind {plan.summary.kind!r}")
        summary = plan.summary or Summary("", "llm")
        if summary.tail is not None and (
            not isinstance(summary.tail, str) or summary.kind != "llm"
        ):
            raise ValueError("not a plan: a summary's tail is text after an LLM summary")
        if not all(edit is None or isinstance(edit, dict) for edit in plan.edits.values()):
            raise ValueError("not a plan: an edit is neither a message nor null")
        if plan.anchor_block is not None and not isinstance(plan.anchor_block, str):
            raise ValueError("not a plan: anchor_block is not text")
        if not isinstance(plan.anchors_truncated, bool):
            raise ValueError("not a plan: anchors_truncated is not a boolean")
        if not all(
            type(level) is int and level > 0 and plan.edits.get(p) is not None
            for p, level in plan.levels.items()
        ):
            raise ValueError("not a plan: a level is not a positive integer of an edit")
        return plan


def _summary_dict(summary: Summary) -> dict[str, Any]:
    data: dict[str, Any] = {"text": summary.text, "kind": summary.kind}
    if summary.tail is not None:
        data["tail"] = summary.tail
    return data


def _summary_of(data: Mapping[str, Any]) -> Summary:
    return Summary(str(data["text"]), data["kind"], data.get("tail"))


def header_message(
    summary: Summary | None, anchor_block: str | None, role: str = "user"
) -> Message | None:
    """The one message standing for the evicted prefix: summary and anchor block."""
    sections = []
    if summary is not None:
        heading = SUMMARY_HEADING if summary.kind == "llm" else DIGEST_HEADING
        sections.append(f"{heading}\n{summary.shown}")
    if anchor_block is not None:
        sections.append(f"{ANCHOR_HEADING}\n{anchor_block}")
    return {"role": role, "content": "\n\n".join(sections)} if sections else None


class View(Sequence[tuple[int | None, Message]]):
    """The entries of a view (`render_entries`) as `runs`: a range of indices for each run of
    `messages` shown as they are, and each other entry as it is. Its entries, a step per
    message, are made when first asked for: a wire format writes a view by its runs."""

    __slots__ = ("_entries", "messages", "runs")

    def __init__(self, messages: Sequence[Message]) -> None:
        self.messages = messages
        self.runs: list[range | tuple[int | None, Message]] = []
        self._entries: list[tuple[int | None, Message]] | None = None

    def add(self, start: int, stop: int) -> None:
        """The messages from `start` to `stop` (not included), shown as they are."""
        if start < stop:
            self.runs.append(range(start, stop))

    def without(self, omitted: set[int]) -> View:
        """The view without the messages at `omitted`."""
        view = View(self.messages)
        for run in self.runs:
            if not isinstance(run, range):
                view.runs += [] if run[0] in omitted else [run]
                continue
            start = run.start
            for index in sorted(i for i in omitted if i in run):
                view.add(start, index)
                start = index + 1
            view.add(start, run.stop)
        return view

    def shows_all(self) -> bool:
        """Whether the view is every message as it is, in order (read from its runs)."""
        messages, at = self.messages, 0
        for run in self.runs:
            if isinstance(run, range):
                if run.start != at:
                    return False
                at = run.stop
            elif run[0] != at or at >= len(messages) or run[1] is not messages[at]:
                return False
            else:
                at += 1
        return at == len(messages)

    @property
    def entries(self) -> list[tuple[int | None, Message]]:
        if self._entries is None:
            entries: list[tuple[int | None, Message]] = []
            messages = self.messages
            for run in self.runs:
                if isinstance(run, range):
                    entries += enumerate(messages[run.start : run.stop], run.start)
                else:
                    entries.append(run)
            self._entries = entries
        return self._entries

    def __len__(self) -> int:
        return len(self.entries)

    @overload
    def __getitem__(self, index: int) -> tuple[int | None, Message]: ...

    @overload
    def __getitem__(self, index: slice) -> list[tuple[int | None, Message]]: ...

    def __getitem__(
        self, index: int | slice
    ) -> tuple[int | None, Message] | list[tuple[int | None, Message]]:
        return self.entries[index]

    def __iter__(self) -> Iterator[tuple[int | None, Message]]:
        return iter(self.entries)

    def __eq__(self, other: object) -> bool:
        return self.entries == (other.entries if isinstance(other, View) else other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"View({self.entries!r})"


def render_entries(
    messages: Sequence[Message],
    plan: Plan,
    *,
    summary_role: str = "user",
    outside: Mapping[int, int] | None = None,
) -> View:
    """The view `render` makes, each message with where it comes from: the index in
    `messages` of the message it shows (that message itself, or the plan's edit of it), or
    None for the header message. Wire formats map the view back to their own items by it
    (by its runs: a `View` is made a step per edit, not per message).

    System messages and the clients' context stay verbatim and in order; those inside the
    evicted prefix move before the header message, which stands where the kept part of the
    chain begins, as does the plan's `task`. One of them that the plan displaced (in the
    evicted prefix, or after a message the plan dropped) is left out when a later one
    supersedes it (`client_context.superseded`), so that evicted copies do not pile up.

    `outside` is `outside_positions(messages)` when the caller has it (`Chain.outside`).
    """
    header = header_message(plan.summary, plan.anchor_block, summary_role)
    view = View(messages)
    if header is None and plan.cut == 0 and not plan.edits:
        view.add(0, len(messages))
        return view
    if outside is None:
        outside = outside_positions(messages)
    # A step per message outside the chain and per run of edits, not per message: between
    # them the view is runs of the messages as they are. Chain position p is message p + the
    # number of messages outside the chain before it.
    befores = tuple(outside.values())
    cut, task, edits, count = plan.cut, plan.task, plan.edits, len(messages)
    start = min(cut + bisect.bisect_right(befores, cut), count)  # the first kept chain message
    shown = [index for index in outside if index < start]  # kept from the evicted prefix
    position_of_task = -1 if task is None else task
    if task is not None and (at := task + bisect.bisect_right(befores, task)) < start:
        bisect.insort(shown, at)
    for index in shown:
        message = messages[index]
        edit = message if index in outside else edits.get(position_of_task, message)
        if edit is not None:
            view.runs.append((index, applied_edit(edit, message)))
    if header is not None:
        view.runs.append((None, header))
    at = start
    for index, stop, edit in _edited_runs(plan, befores):
        if index >= count:
            break
        view.add(at, index)
        at = stop
        if edit is not None:
            view.runs.append((index, applied_edit(edit, messages[index])))
    view.add(at, count)
    if len(outside) > 1:
        copies = superseded(messages, outside, plan.covered)
        omitted = set(left_out(copies, cut, edits)) if copies else ()
        if omitted:
            return view.without(omitted)
    return view


def _edited_runs(plan: Plan, befores: tuple[int, ...]) -> list[tuple[int, int, Message | None]]:
    """The messages that the plan's edits from its cut on replace or drop, in runs of indices
    (the first, the one after the last, the edit: None for a run of drops), given the number
    of chain messages before each message outside the chain, in order (`befores`). Made once
    for a plan and the places of the messages outside the chain."""
    made = plan._runs
    runs = made.get(befores)
    if runs is None:
        runs = []
        for position in sorted(p for p in plan.edits if p >= plan.cut):
            index = position + bisect.bisect_right(befores, position)
            edit = plan.edits[position]
            if edit is None and runs and runs[-1][1] == index and runs[-1][2] is None:
                runs[-1] = (runs[-1][0], index + 1, None)
            else:
                runs.append((index, index + 1, edit))
        made.clear()  # those of the places of the latest turn only
        made[befores] = runs
    return runs


def applied_edit(edit: Message, message: Message) -> Message:
    """A stored edit applied to `message` as the client sends it now: the edit replaces the
    content and the tool calls (or leaves them out), and only where it changed them (a
    cleared result's content, a truncated call's arguments, a cleared image); every other
    field, and every part and call the edit left alone, comes from `message`. So a field
    the chain does not hash (an unknown field, a text part's extra keys) is never replayed
    stale. `edit` itself when that is what it comes to."""
    if edit is message:
        return edit
    content = edit.get("content")
    if (
        (content is None or isinstance(content, str))
        and "tool_calls" not in edit
        and "tool_calls" not in message
    ):
        # The common edit, a whole text content (a cleared or truncated result): cheap, as
        # a replayed turn applies every edit of its plan.
        applied: Message = {**message, "content": content} if "content" in edit else message
        return edit if applied == edit else applied
    applied = {}
    for key, value in message.items():
        if key == "content":
            applied[key] = _content(edit[key], value) if key in edit else value
        elif key == "tool_calls":
            if key in edit:  # else the edit removed the calls (the text of a dropped block)
                applied[key] = _calls(edit[key], value)
        else:
            applied[key] = value
    for key in ("content", "tool_calls"):
        if key in edit and key not in message:
            applied[key] = edit[key]
    return edit if applied == edit else applied


def _content(edited: Any, current: Any) -> Any:
    if edited == current or not (
        isinstance(edited, list) and isinstance(current, list) and len(edited) == len(current)
    ):
        return edited
    pairs = zip(edited, current, strict=True)
    return [now if _same_part(part, now) else part for part, now in pairs]


def _same_part(part: Any, now: Any) -> bool:
    """Whether the edit left this content part alone (text parts are the same by their text)."""
    if part == now:
        return True
    return (
        isinstance(part, dict)
        and isinstance(now, dict)
        and part.get("type") == now.get("type") == "text"
        and part.get("text") == now.get("text")
    )


def _calls(edited: Any, current: Any) -> Any:
    if edited == current or not (
        isinstance(edited, list) and isinstance(current, list) and len(edited) == len(current)
    ):
        return edited
    return [_call(call, now) for call, now in zip(edited, current, strict=True)]


def _call(call: Any, now: Any) -> Any:
    """The call as sent now, with the arguments the edit gave it (a truncation)."""
    if call == now:
        return now
    if not (isinstance(call, dict) and isinstance(now, dict)):
        return call
    arguments = call_arguments(call)
    if arguments == call_arguments(now):
        return now
    return {**now, "function": {**call_function(now), "arguments": arguments}}


def render(messages: Sequence[Message], plan: Plan, *, summary_role: str = "user") -> list[Message]:
    """The view that is forwarded: `messages` rewritten by `plan` (see `render_entries`)."""
    return [message for _, message in render_entries(messages, plan, summary_role=summary_role)]
