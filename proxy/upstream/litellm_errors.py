"""litellm's exceptions as the errors a chat completions client expects.

litellm raises one exception per failure, whatever the provider said; the client gets OpenAI's
error shape with a status it can act on: 400 `context_length_exceeded` for a prompt over the
window (which the request path retries compacted harder), 401, 403, 404, 400 for content
policy, 429 with the provider's Retry-After, 502 when the provider could not be reached or
broke off, 504 on a timeout, and the status litellm gives for anything else. Messages keep the
provider's words without litellm's decorations, and never a credential of the upstream.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable
from typing import Any

import orjson

from proxy.config import SECRET_PROVIDER_PARAMS, Upstream
from proxy.errors import APIError, ContextLengthExceeded, ProviderError, UpstreamTimeout

# By litellm's exception class name (the classes themselves live in the module imported
# only when an upstream of kind litellm is configured): status, OpenAI's type and code.
_BY_CLASS: dict[str, tuple[int, str, str | None]] = {
    "AuthenticationError": (401, "invalid_request_error", "invalid_api_key"),
    "PermissionDeniedError": (403, "invalid_request_error", "permission_denied"),
    "NotFoundError": (404, "invalid_request_error", "model_not_found"),
    "ContentPolicyViolationError": (400, "invalid_request_error", "content_policy_violation"),
    "RateLimitError": (429, "rate_limit_error", "rate_limit_exceeded"),
}
# Failures of the connection itself, anywhere in the exception's chain: the provider was
# unreachable or broke off (httpx's and aiohttp's errors, and the OS's).
_TRANSPORT_ERRORS = frozenset(
    {"APIConnectionError", "ConnectError", "ReadError", "RemoteProtocolError", "WriteError"}
)
_LITELLM_PREFIX = re.compile(r"^(?:litellm\.\w+: )+")
_HANDLE_WITH = re.compile(r"\s*Handle with `litellm\.\w+`\.?\s*$")


@dataclasses.dataclass(frozen=True)
class Failure:
    """A failure as the client sees it, and the Retry-After to send with it."""

    error: APIError
    retry_after: str | None = None


def failure(exc: BaseException, upstream: Upstream) -> Failure:
    """The client's error for a litellm exception raised for `upstream`."""
    names = [cls.__name__ for cls in type(exc).__mro__]
    message = _message(exc, upstream)
    if "ContextWindowExceededError" in names:
        return Failure(ContextLengthExceeded(message, param="messages"))
    if "Timeout" in names:
        return Failure(
            UpstreamTimeout(f"upstream {upstream.name!r} did not answer in time: {message}")
        )
    if _unreachable(exc):
        return Failure(
            ProviderError(
                f"upstream {upstream.name!r} is unreachable: {message}",
                status_code=502,
                error_type="upstream_error",
                code="upstream_unreachable",
            )
        )
    for name in names:
        if name in _BY_CLASS:
            status, kind, code = _BY_CLASS[name]
            retry = _retry_after(exc) if status == 429 else None
            error = ProviderError(message, status_code=status, error_type=kind, code=code)
            return Failure(error, retry)
    given = getattr(exc, "status_code", None)
    status = given if isinstance(given, int) and 400 <= given <= 599 else 500
    kind = "invalid_request_error" if status < 500 else "upstream_error"
    return Failure(ProviderError(message, status_code=status, error_type=kind))


def _chain(exc: BaseException) -> Iterable[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _unreachable(exc: BaseException) -> bool:
    for link in _chain(exc):
        if isinstance(link, OSError) or type(link).__name__ in _TRANSPORT_ERRORS:
            return True
    return False


def _retry_after(exc: BaseException) -> str | None:
    headers: Any = getattr(exc, "litellm_response_headers", None)
    if headers is None:
        response = getattr(exc, "response", None)
        headers = getattr(response, "headers", None)
    value = headers.get("retry-after") if headers is not None else None
    return str(value) if value else None


def _message(exc: BaseException, upstream: Upstream) -> str:
    """The provider's words: without litellm's class prefixes and advice, the message of the
    provider's error body when it sent one, and never a secret of the upstream."""
    text = str(getattr(exc, "message", None) or exc or type(exc).__name__)
    text = _HANDLE_WITH.sub("", _LITELLM_PREFIX.sub("", text)).strip()
    provider, said, body = text.partition(" - ")
    if said and provider.endswith(("Exception", "Error")):
        text = _error_message(body) or body
    secrets = [upstream.api_key or ""]
    secrets += [v for k, v in upstream.provider_params.items() if k in SECRET_PROVIDER_PARAMS]
    for secret in secrets:
        if len(secret) >= 4:
            text = text.replace(secret, "***")
    return text or type(exc).__name__


def _error_message(body: str) -> str | None:
    """`error.message` of a provider's JSON error body (Anthropic's, Google's, OpenAI's)."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    error = data.get("error") if isinstance(data, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    return message if isinstance(message, str) and message else None
