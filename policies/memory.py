"""Memory candidates: user preferences, "remember" requests, decisions and facts found by rules
in messages that are being evicted (a memory flush, by rules).

Rules, not a model: cheap, deterministic, and each with a confidence that says how sure the
rule is. They are candidates for a human or an agent to review (the admin API shows them).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from policies.message import Message, content_text

MAX_TEXT = 2048  # UTF-8 bytes


@dataclass(frozen=True)
class Rule:
    kind: str
    confidence: float
    pattern: re.Pattern[str]
    roles: tuple[str, ...] = ("user",)


def _rule(kind: str, confidence: float, pattern: str, *roles: str) -> Rule:
    return Rule(kind, confidence, re.compile(pattern, re.IGNORECASE), roles or ("user",))


# One sentence at a time; the first matching rule wins (most specific first).
RULES = (
    _rule(
        "remember",
        0.95,
        r"\b(?:please\s+)?(?:remember|don't forget|do not forget|note that)\b"
        r"|\bplease note\b|\bnote:",
    ),
    _rule(
        "preference",
        0.8,
        r"\b(?:i|we)\s+(?:always\s+|usually\s+|really\s+)?(?:prefer|like|love|hate|dislike|want|"
        r"need|don't want|do not want|never want)\b",
    ),
    _rule("constraint", 0.75, r"\b(?:always|never|must|must not|mustn't|do not|don't)\b"),
    _rule(
        "decision",
        0.7,
        r"\b(?:let's go with|we(?:'ll| will)? (?:go with|use|choose)|decided|decision:|"
        r"i(?:'ll| will) (?:go with|use|choose))\b",
        "user",
        "assistant",
    ),
    _rule(
        "fact",
        0.6,
        r"\b(?:my|our) [\w\s-]{1,30}? (?:is|are|was)\b|\bi am\b|\bi'm\b|\bi work\b|\bi live\b",
    ),
)

_SENTENCE = re.compile(r"(?<=[.!?\n])\s+")


def memory_candidates(messages: Sequence[Message]) -> list[dict[str, object]]:
    """Candidates from the user (and, for decisions, assistant) text of `messages`, in order,
    each {"kind", "text", "confidence", "role"}; duplicates kept once."""
    found: list[dict[str, object]] = []
    seen: set[str] = set()
    for message in messages:
        role = message.get("role")
        if role not in ("user", "assistant"):
            continue
        for sentence in _SENTENCE.split(content_text(message.get("content"))):
            text = sentence.strip()
            # A question asks rather than tells ("do you remember ...?").
            if len(text) < 8 or text in seen or text.endswith("?"):
                continue
            for rule in RULES:
                if role in rule.roles and rule.pattern.search(text):
                    seen.add(text)
                    found.append(
                        {
                            "kind": rule.kind,
                            "text": text.encode()[:MAX_TEXT].decode(errors="ignore"),
                            "confidence": rule.confidence,
                            "role": role,
                        }
                    )
                    break
    return found
