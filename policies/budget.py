"""The token budget of one request: the usable part of the window and its levels."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Status = Literal["ok", "prepare", "compact"]


@dataclass(frozen=True)
class Budget:
    """What a request may spend on its prompt; the levels are fractions of `limit`."""

    window: int
    reserved_output: int
    safety_margin: int
    limit: int
    prepare_tokens: int
    compact_tokens: int
    target_tokens: int

    def status(self, tokens: int) -> Status:
        """`compact` at or over the compact level, `prepare` at or over the prepare level."""
        if tokens >= self.compact_tokens:
            return "compact"
        if tokens >= self.prepare_tokens:
            return "prepare"
        return "ok"


def make_budget(
    *,
    window: int,
    model_max_output: int | None,
    request_max_tokens: int | None,
    reserved_output_tokens: int,
    safety_margin_tokens: int,
    prepare_at: float,
    compact_at: float,
    target: float,
) -> Budget:
    """The budget of a request.

    The upstream checks prompt + max_tokens against the window, so a client's max_tokens is
    reserved exactly; otherwise min(policy value, model's max output, a quarter of the window).
    """
    if window < 0 or reserved_output_tokens < 0 or safety_margin_tokens < 0:
        raise ValueError("window, reserved output and safety margin must not be negative")
    if not (0 < target < compact_at <= 1 and 0 < prepare_at <= 1):
        raise ValueError("levels must satisfy 0 < target < compact_at <= 1 and 0 < prepare_at <= 1")
    if request_max_tokens is not None:
        reserved = max(0, request_max_tokens)
    else:
        reserved = min(reserved_output_tokens, window // 4)
        if model_max_output is not None:
            reserved = min(reserved, model_max_output)
    limit = max(0, window - reserved - safety_margin_tokens)
    return Budget(
        window=window,
        reserved_output=reserved,
        safety_margin=safety_margin_tokens,
        limit=limit,
        prepare_tokens=int(limit * prepare_at),
        compact_tokens=int(limit * compact_at),
        target_tokens=int(limit * target),
    )
