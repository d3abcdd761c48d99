"""What only some wire formats have: each capability a `Dialect` of its own, which a dialect
that has it derives from, and which callers ask for (`isinstance(dialect, Capability)`);
a dialect without it is left alone.

    TokenCounting      an endpoint that counts a prompt's tokens (Anthropic's count_tokens)
    CacheBreakpoints   a prompt cache that ends at breakpoints the request marks (Anthropic's)
    Entitlements       request headers that widen the window or restrict the credential's
                       use (Anthropic's 1M-context beta, a subscription's token)
    StreamStartUsage   usage at the start of a stream (Anthropic's message_start)
    StreamOverflow     an overflow reported inside a 200 stream (the Responses API's)
    OutputLimits       a window that holds the prompt and the output a request reserves
                       (max_tokens), which it may lower; an overflow error that says
                       which overflowed (not the Responses API's)
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping, Sequence
from typing import ClassVar, NamedTuple

from proxy.dialects.base import Dialect, Entries, Parsed, Usage


class TokenCounting(Dialect):
    """An API with an endpoint that counts a prompt's tokens: the proxy answers it for the
    session's view, and asks it near the compaction level (`exact_count`)."""

    count_path: ClassVar[str]  # the inbound path
    count_upstream_path: ClassVar[str]  # relative to the upstream's base URL

    @abstractmethod
    def count_body(self, body: bytes) -> bytes:
        """The request to the count endpoint for the request `body`: the fields that make up
        the prompt."""

    @abstractmethod
    def counted(self, payload: bytes) -> int | None:
        """The prompt tokens in the count endpoint's answer (None: not a count)."""


class CacheBreakpoints(Dialect):
    """An API that caches a prompt only up to breakpoints the request marks: the proxy adds
    its own, even to a request it does not otherwise change."""

    @abstractmethod
    def render(self, parsed: Parsed, entries: Entries, breakpoints: bool = False) -> bytes:
        """`Dialect.render`, with the proxy's own prompt-cache breakpoints when
        `breakpoints`."""


class Entitlements(Dialect):
    """An API whose request headers say what the request is entitled to beyond its body: a
    wider context window, or a credential only for the client's own requests."""

    @abstractmethod
    def window(self, headers: Mapping[str, str]) -> int | None:
        """The context window the request's own headers open, when they set one."""

    @abstractmethod
    def may_reuse_credentials(self, credentials: Sequence[tuple[str, str]]) -> bool:
        """Whether the client's credential may pay for the proxy's own calls (summaries) on
        its upstream; a credential that is only for the client's own requests may not."""


class StreamStartUsage(Dialect):
    """An API that reports usage at the start of a stream, not only at its end."""

    @abstractmethod
    def stream_start_usage(self, head: bytes) -> Usage | None:
        """Usage from the first bytes of a streamed response (preferred to the tail's when
        both are there)."""


class StreamOverflow(Dialect):
    """An API that may report an overflow inside a streamed 200 answer: the proxy reads the
    stream's first bytes before relaying any, to retry compacted harder."""

    @abstractmethod
    def stream_overflow(self, head: bytes) -> bool | None:
        """Whether the first bytes of a streamed 200 answer say the prompt is over the window
        (None: not known yet)."""


class OutputOverflow(NamedTuple):
    """An overflow error's own figures, in the upstream's tokens: `prompt + output > window`."""

    prompt: int
    output: int  # the output the request reserved (max_tokens)
    window: int

    @property
    def prompt_fits(self) -> bool:
        """Whether the prompt alone fits: only the reserved output overflowed."""
        return self.prompt < self.window


class OutputLimits(Dialect):
    """An API whose window must hold the prompt and the output the request reserves: a
    request may ask for less output, and its overflow error may say both."""

    @abstractmethod
    def output_overflow(self, payload: bytes) -> OutputOverflow | None:
        """The figures of an overflow error that counts the reserved output (None: not one)."""

    def overflow_prompt(self, payload: bytes) -> int | None:
        """The upstream's count of the prompt an overflow error without `output_overflow`'s
        figures refused, when it says it (None here: the API's errors have only those)."""
        return None

    @abstractmethod
    def with_max_output(self, body: bytes, max_output: int) -> bytes | None:
        """`body` reserving `max_output` output tokens; None when it cannot (the request's own
        rules want more, such as extended thinking's budget)."""
