"""The proxy's own errors, each rendered in OpenAI's error shape.

Upstream errors are never wrapped: they reach the client with their own status and body.
These are only for failures the proxy itself detects.
"""

from __future__ import annotations

import orjson


class ProxyError(Exception):
    """An error the client sees as `{"error": {"message", "type", "param", "code"}}`."""

    status_code = 500
    error_type = "server_error"
    code: str | None = None

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code

    def body(self) -> bytes:
        return error_body(self.message, self.error_type, self.param, self.code)


class InvalidRequest(ProxyError):
    status_code = 400
    error_type = "invalid_request_error"


class ContextLengthExceeded(InvalidRequest):
    code = "context_length_exceeded"


class Unauthorized(ProxyError):
    status_code = 401
    error_type = "invalid_request_error"
    code = "invalid_api_key"


class NotFound(ProxyError):
    status_code = 404
    error_type = "invalid_request_error"
    code = "not_found"


class BodyTooLarge(ProxyError):
    status_code = 413
    error_type = "invalid_request_error"
    code = "request_too_large"


class UpstreamUnreachable(ProxyError):
    status_code = 502
    error_type = "upstream_error"
    code = "upstream_unreachable"


class StoreUnavailableError(ProxyError):
    """Raised only when the store is configured to fail closed."""

    status_code = 503
    error_type = "server_error"
    code = "session_store_unavailable"


class UpstreamTimeout(ProxyError):
    status_code = 504
    error_type = "upstream_error"
    code = "upstream_timeout"


def error_body(
    message: str, error_type: str, param: str | None = None, code: str | None = None
) -> bytes:
    return orjson.dumps(
        {"error": {"message": message, "type": error_type, "param": param, "code": code}}
    )
