"""The proxy's exceptions: one tree under `ProxyError`.

    ProxyError                the root: everything the proxy raises on purpose
    ├── ConfigError           the configuration is invalid (proxy.config)
    ├── NoRoute               no configured upstream serves this request's API (proxy.config)
    ├── StreamBroken          an upstream stopped sending in the middle of a body
    ├── AnswerTooLarge        an answer the proxy reads whole is larger than it holds
    ├── SummaryFailed         the summarizer gave no usable summary
    │   ├── SummaryPending        not within the request's wait: finished in the background
    │   └── SummaryTooShort       too small an output budget to be worth a call: not made
    ├── HookFailed            a compaction hook's call failed: left out (proxy.hooks)
    ├── RecordingError        a recorded file cannot be read (proxy.recordings)
    │   └── ReplayError           a recorded request cannot be replayed (proxy.replay)
    ├── ChartError            a replay's chart cannot be drawn (proxy.chart)
    ├── AdminCallFailed       `compaction-proxy sessions` got no good answer (proxy.admin_client)
    └── APIError              what a client sees: a status and an error in its API's shape
        ├── InvalidRequest        400  (ContextLengthExceeded: 400 context_length_exceeded;
        │                              PreviousResponseNotFound: 400 previous_response_not_found,
        │                              a WebSocket's continuation the proxy cannot rebuild)
        ├── Unauthorized          401
        ├── Forbidden             403  the dashboard's checks on a request without the token
        ├── NotFound              404
        ├── BodyTooLarge          413
        ├── UnsupportedMediaType  415  a body's Content-Encoding the proxy cannot decode
        ├── UpgradeRequired       426  a WebSocket upgrade the proxy does not serve
        ├── Overloaded            429  listen.max_concurrent_requests are already in flight
        ├── HeadTooLarge          431  refused by the server's protocol, before any route
        ├── UpstreamUnreachable   502
        ├── StoreUnavailable      503  the session store did not answer (served fail-open
        │                              unless the config says fail closed)
        ├── ShuttingDown          503  the proxy ended the request at the end of its shutdown
        ├── UpstreamTimeout       504
        └── ProviderError         any  a provider's error through litellm (kind litellm),
                                       with its status as mapped (proxy.litellm_errors)

An `APIError` carries OpenAI's fields (message, type, param, code); each wire format renders
it in its own shape (proxy.dialects). Upstream errors are never wrapped: they reach the client
with the upstream's own status and body; those of providers reached through litellm, which
has no body of theirs to relay, as a `ProviderError` in OpenAI's shape.
"""

from __future__ import annotations


class ProxyError(Exception):
    """The root of every exception the proxy raises on purpose."""


class StreamBroken(ProxyError):
    """The upstream stopped sending in the middle of a body (stalled, reset, closed)."""


class AnswerTooLarge(ProxyError):
    """An answer the proxy reads whole for itself (a summary, a count, a hook's) is larger
    than it holds (proxy.upstream.bounded)."""


class SummaryFailed(ProxyError):
    """The summarizer gave no usable summary (error, timeout, empty, or cooling down)."""


class SummaryTooShort(SummaryFailed):
    """The summary could have too few tokens to say anything (a window nearly filled by
    max_tokens leaves a tiny target): no call is made, the digest stands in."""


class SummaryPending(SummaryFailed):
    """The summary was not ready within the time a request waits for it; it is finished in
    the background and takes the digest's place from the next turn."""


class HookFailed(ProxyError):
    """A compaction hook answered with an error status or an answer it may not give; the
    compaction goes on without it."""


class APIError(ProxyError):
    """An error the client sees, with a status code and OpenAI's error fields."""

    status_code, error_type = 500, "server_error"
    code: str | None = None
    # Headers the answer carries besides the error: the x-compaction-* ones that still hold
    # when a request failed after its session was found (its session, the store's state).
    headers: tuple[tuple[str, str], ...] = ()

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code


class InvalidRequest(APIError):
    status_code, error_type = 400, "invalid_request_error"


class ContextLengthExceeded(InvalidRequest):
    code = "context_length_exceeded"


class PreviousResponseNotFound(InvalidRequest):
    """A WebSocket's request continues a response that its connection does not hold: Codex
    then reconnects and sends the whole input."""

    code = "previous_response_not_found"


class Unauthorized(APIError):
    status_code, error_type, code = 401, "invalid_request_error", "invalid_api_key"


class Forbidden(APIError):
    status_code, error_type, code = 403, "permission_error", "forbidden"


class NotFound(APIError):
    status_code, error_type, code = 404, "invalid_request_error", "not_found"


class BodyTooLarge(APIError):
    status_code, error_type, code = 413, "invalid_request_error", "request_too_large"


class UnsupportedMediaType(APIError):
    status_code, error_type, code = 415, "invalid_request_error", "unsupported_content_encoding"


class UpgradeRequired(APIError):
    """A WebSocket upgrade the proxy does not serve (a path other than the Responses API's, or
    `listen.websockets: false`), answered with 426: the client is to send its request over
    HTTP."""

    status_code, error_type, code = 426, "invalid_request_error", "websocket_unsupported"


class HeadTooLarge(APIError):
    status_code, error_type, code = 431, "invalid_request_error", "request_header_fields_too_large"


class Overloaded(APIError):
    """Refused before its body was read: the proxy is at its concurrency cap."""

    status_code, error_type, code = 429, "rate_limit_error", "proxy_overloaded"


class UpstreamUnreachable(APIError):
    status_code, error_type, code = 502, "upstream_error", "upstream_unreachable"


class StoreUnavailable(APIError):
    """The session store could not answer (down, timeout, protocol error). Requests are served
    without the session's state (fail open); a client only sees it when the store is
    configured to fail closed."""

    status_code, error_type, code = 503, "server_error", "session_store_unavailable"


class ShuttingDown(APIError):
    """Still unanswered when the shutdown's grace period ran out."""

    status_code, error_type, code = 503, "server_error", "proxy_shutting_down"


class UpstreamTimeout(APIError):
    status_code, error_type, code = 504, "upstream_error", "upstream_timeout"

    @classmethod
    def in_phase(cls, upstream: str, phase: str, what: str) -> UpstreamTimeout:
        """A timeout of the proxy's own, its message naming the phase that ran out (as the
        `phase` of compaction_proxy_upstream_timeouts_total does)."""
        return cls(f"upstream {upstream!r}: {phase} timeout, {what}")


class ProviderError(APIError):
    """What a provider reached through litellm answered, as OpenAI's error fields."""

    def __init__(
        self, message: str, *, status_code: int, error_type: str, code: str | None = None
    ) -> None:
        super().__init__(message, code=code)
        self.status_code = status_code
        self.error_type = error_type
