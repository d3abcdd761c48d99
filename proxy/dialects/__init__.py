"""The wire formats the proxy accepts, each a `Dialect` of the one compaction engine.

A new wire format is one new module here with a `Dialect` subclass, added to `DIALECTS`; it
derives from the capabilities (`capabilities`) its API has, too.
"""

from proxy.config import DIALECTS_BY_KIND
from proxy.dialects.anthropic.messages import Messages
from proxy.dialects.base import Dialect, Entries, Parsed, Usage
from proxy.dialects.capabilities import (
    CacheBreakpoints,
    Entitlements,
    OutputLimits,
    OutputOverflow,
    StreamOverflow,
    StreamStartUsage,
    TokenCounting,
)
from proxy.dialects.openai.chat import Chat
from proxy.dialects.openai.responses import Responses

DIALECTS: tuple[Dialect, ...] = (Chat(), Responses(), Messages())
_BY_NAME = {dialect.name: dialect for dialect in DIALECTS}


def dialect_of_kind(kind: str) -> Dialect:
    """The main wire format of an upstream kind (what the proxy's own calls to it speak)."""
    return _BY_NAME[DIALECTS_BY_KIND[kind][0]]


__all__ = [
    "DIALECTS",
    "CacheBreakpoints",
    "Dialect",
    "Entitlements",
    "Entries",
    "OutputLimits",
    "OutputOverflow",
    "Parsed",
    "StreamOverflow",
    "StreamStartUsage",
    "TokenCounting",
    "Usage",
    "dialect_of_kind",
]
