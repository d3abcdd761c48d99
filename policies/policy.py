"""A compaction policy: when to compact and how far, what to protect, and the layers to run."""

from __future__ import annotations

from dataclasses import dataclass

from policies.anchors import anchor_pattern
from policies.budget import Budget
from policies.layers import DEFAULT_LAYERS, LAYERS, LayerSpec

SUMMARY_ROLES = ("user", "system", "developer", "assistant")


@dataclass(frozen=True)
class Policy:
    """Everything the engine needs of a policy; every rule on its values is checked here
    (a ValueError says every rule broken).

    The levels are fractions of the usable budget (window - reserved output - safety
    margin): a summary is prepared ahead at `prepare_at`, the conversation is compacted at
    `compact_at`, down to `target`; in a conversation whose turns are large, further (see
    `aim`), down to `target_floor` at most. The `protect_*` sizes say which recent text stays
    verbatim, `anchors` (regular expressions) what must stay visible, `summary_role` the
    role of the summary message, and `layers` what runs, in order.
    """

    reserved_output_tokens: int = 4096
    safety_margin_tokens: int = 256
    prepare_at: float = 0.75
    compact_at: float = 0.9
    target: float = 0.7
    headroom_turns: int = 4
    target_floor: float = 0.25
    protect_recent_rounds: int = 12
    protect_min_tokens: int = 10_000
    protect_min_text_messages: int = 5
    protect_max_tokens: int = 40_000
    anchors: tuple[str, ...] = ()
    anchor_block_max_tokens: int = 1000
    summary_role: str = "user"
    layers: tuple[LayerSpec, ...] = DEFAULT_LAYERS

    def __post_init__(self) -> None:
        problems = []
        if not 0 < self.target < self.compact_at <= 1:
            problems.append("levels must satisfy 0 < target < compact_at <= 1")
        if not 0 < self.prepare_at <= self.compact_at:
            problems.append("levels must satisfy 0 < prepare_at <= compact_at")
        if not 0 < self.target_floor <= 1:
            problems.append("target_floor must be in (0, 1]")
        sizes = {
            "reserved_output_tokens": self.reserved_output_tokens,
            "safety_margin_tokens": self.safety_margin_tokens,
            "headroom_turns": self.headroom_turns,
            "protect_recent_rounds": self.protect_recent_rounds,
            "protect_min_tokens": self.protect_min_tokens,
            "protect_min_text_messages": self.protect_min_text_messages,
            "protect_max_tokens": self.protect_max_tokens,
            "anchor_block_max_tokens": self.anchor_block_max_tokens,
        }
        negative = [name for name, size in sizes.items() if size < 0]
        if negative:
            problems.append(f"{', '.join(negative)} must not be negative")
        if self.summary_role not in SUMMARY_ROLES:
            problems.append(f"summary_role must be one of {', '.join(SUMMARY_ROLES)}")
        for name, params in self.layers:
            layer = LAYERS.get(name)
            if layer is None or not isinstance(params, layer.params):
                problems.append(f"layer {name!r} with {type(params).__name__} is not a layer")
        for pattern in self.anchors:
            try:
                anchor_pattern(pattern)  # a bad pattern fails here, when it is configured
            except ValueError as error:
                problems.append(str(error))
        if problems:
            raise ValueError("; ".join(problems))

    def budget(
        self, window: int, model_max_output: int | None, request_max_tokens: int | None
    ) -> Budget:
        """The budget of a request for a model with this window and max output.

        The upstream checks prompt + max_tokens against the window, so a client's max_tokens
        is reserved exactly; otherwise min(reserved_output_tokens, the model's max output, a
        quarter of the window). The limit is never negative: a budget without room for a
        prompt says so (`Budget.usable`).
        """
        if window < 0:
            raise ValueError("the window must not be negative")
        if request_max_tokens is not None:
            reserved = max(0, request_max_tokens)
        else:
            reserved = min(self.reserved_output_tokens, window // 4)
            if model_max_output is not None:
                reserved = min(reserved, model_max_output)
        limit = max(0, window - reserved - self.safety_margin_tokens)
        return Budget(
            window=window,
            reserved_output=reserved,
            safety_margin=self.safety_margin_tokens,
            limit=limit,
            prepare_tokens=int(limit * self.prepare_at),
            compact_tokens=int(limit * self.compact_at),
            target_tokens=int(limit * self.target),
        )

    def aim(self, budget: Budget, growth: int) -> int:
        """How far a compaction goes: the target, or, in a conversation whose turns add
        `growth` tokens each, low enough that `headroom_turns` more fit under the compact
        level before the next compaction (so that providers' caches keep hitting); never
        below `target_floor` of the budget. Small turns leave it at the target."""
        room = budget.compact_tokens - self.headroom_turns * growth
        floor = min(int(budget.limit * self.target_floor), budget.target_tokens)
        return max(min(budget.target_tokens, room), floor)

    def short(self, budget: Budget, growth: int, tokens: int) -> bool:
        """Whether a compaction that left the view at `tokens` made too little room: not
        `headroom_turns` (at least one) more turns of `growth` under the compact level. The
        next compaction could do no better (what it cannot remove, the fixed part and the
        current turn, stays as large), so it waits for the limit instead: compacting at the
        compact level would only change the forwarded prefix turn after turn."""
        return tokens + max(1, self.headroom_turns) * growth > budget.compact_tokens
