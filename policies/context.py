"""What every layer knows about one request, computed once by the pipeline."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from policies.anchors import find_anchors
from policies.compress import salient_lines
from policies.counting import Counter
from policies.message import Message, content_text, is_error_result, visible_text
from policies.summary import Summarizer


@dataclass(frozen=True, eq=False)
class Context:
    """The request's chain (its non-system messages) and the limits the layers work to.

    `turn_start` and `task` are the current turn (never changed): the chain from
    `turn_start` on, and the last user message before it in an agent loop. User and
    assistant text from `protected_start` on is kept verbatim except by `trim_head`.
    `aim_tokens` is how far the layers compact (`Policy.aim`); the emergency layer only
    drops messages for `target_tokens`, and the sizes derived from the target (protection,
    summary and anchor caps) are of `target_tokens` too.
    """

    counter: Counter
    chain: tuple[Message, ...]
    chain_tokens: tuple[int, ...]
    system_tokens: int
    fixed_tokens: int
    target_tokens: int
    aim_tokens: int
    limit_tokens: int
    turn_start: int
    task: int | None
    protected_start: int
    blocks: tuple[range, ...]
    tool_names: Mapping[str, str]
    summary_role: str = "user"
    anchors: tuple[re.Pattern[str], ...] = ()
    anchor_block_max_tokens: int = 0
    summarizer: Summarizer | None = None
    instructions: str | None = None
    # Caches of derived values: an edit is counted once however often layers look at it.
    _edit_tokens: dict[int, tuple[Message, int]] = field(default_factory=dict, repr=False)
    _anchors: dict[int, tuple[str, ...]] = field(default_factory=dict, repr=False)
    _salient: dict[int, tuple[str, ...]] = field(default_factory=dict, repr=False)

    def in_turn(self, position: int) -> bool:
        return position >= self.turn_start or position == self.task

    def tool_selected(
        self, message: Message, allow: tuple[str, ...] | None, deny: tuple[str, ...]
    ) -> bool:
        """Whether the tool that answered with `message` passes a layer's tool lists (`allow`
        None: every tool but those in `deny`)."""
        name = self.tool_names.get(str(message.get("tool_call_id")), message.get("name"))
        if name in deny:
            return False
        return allow is None or name in allow

    @property
    def floor_tokens(self) -> int:
        """Tokens no compaction can remove: fixed, system messages and the current turn."""
        turn = sum(self.chain_tokens[self.turn_start :])
        if self.task is not None:
            turn += self.chain_tokens[self.task]
        return self.fixed_tokens + self.system_tokens + turn

    def message_tokens(self, position: int, message: Message | None) -> int:
        """Tokens of `message` standing at `position` (an original or an edit; None is 0)."""
        if message is None:
            return 0
        if message is self.chain[position]:
            return self.chain_tokens[position]
        cached = self._edit_tokens.get(position)
        if cached is None or cached[0] is not message:
            cached = (message, self.counter.message(message))
            self._edit_tokens[position] = cached
        return cached[1]

    def anchor_matches(self, position: int, *, salient: bool = True) -> tuple[str, ...]:
        """What must stay visible of the original message at `position` when it is removed
        or changed: its anchors and, for a tool output and with `salient`, its salient lines
        (its errors and failures, see `policies.compress.salient_lines`; not of a compressed
        output, which keeps them in its own form)."""
        found = self._anchors.get(position)
        if found is None:
            found = self._anchors[position] = (
                find_anchors(self.anchors, visible_text(self.chain[position]))
                if self.anchors
                else ()
            )
        if not salient:
            return found
        lines = self.salient_lines(position)
        return (*found, *(line for line in lines if line not in found)) if lines else found

    def salient_lines(self, position: int) -> tuple[str, ...]:
        """The salient lines of the tool output at `position` (none for other messages)."""
        message = self.chain[position]
        if message.get("role") != "tool":
            return ()
        found = self._salient.get(position)
        if found is None:
            text = content_text(message.get("content"))
            found = tuple(salient_lines(text, is_error=is_error_result(message)))
            self._salient[position] = found
        return found


def turn_growth(chain_tokens: Sequence[int], chain: Sequence[Message], turns: int = 8) -> int:
    """The tokens a turn adds to this conversation, on average over its newest `turns` turns.
    A turn runs from an assistant message to the next one: the answer, and what the client
    sends after it (the user's next message, or the tool results)."""
    starts = [p for p, message in enumerate(chain) if message.get("role") == "assistant"]
    recent = starts[-turns:]
    return sum(chain_tokens[recent[0] :]) // len(recent) if recent else 0


def protected_start(
    chain: Sequence[Message],
    chain_tokens: Sequence[int],
    *,
    turn_start: int,
    rounds: int,
    min_tokens: int,
    min_text_messages: int,
    max_tokens: int,
    cap: int,
) -> int:
    """Where the protected part begins: the newest `rounds` rounds, or the newest messages
    holding `min_tokens` and `min_text_messages` text messages, whichever is reached first,
    at most `max_tokens` and `cap`; the current turn is always inside."""
    tokens = texts = seen = 0
    for position in reversed(range(len(chain))):
        tokens += chain_tokens[position]
        if tokens > cap:
            return min(position + 1, turn_start)
        message = chain[position]
        seen += message.get("role") == "user"
        texts += message.get("role") in ("user", "assistant") and bool(
            content_text(message.get("content")).strip()
        )
        if (
            seen >= rounds
            or tokens >= max_tokens
            or (tokens >= min_tokens and texts >= min_text_messages)
        ):
            return min(position, turn_start)
    return 0
