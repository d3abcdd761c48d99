"""Upstreams of kind litellm: chat completions to any provider litellm serves.

The request body (OpenAI chat completions, as the request path forwards it) becomes the
keyword arguments of `litellm.acompletion`; the answer goes back as OpenAI's JSON, or as SSE
`chat.completion.chunk` events relayed one by one as litellm yields them, ending in one
`data: [DONE]` (a failure mid-stream ends with an error event instead). Only the fields of
chat completions reach litellm: a client can never set litellm's own arguments (`api_base`,
`api_key`, `mock_response`, ...), so requests only go where the config says.

litellm itself is imported and set up at start-up by `proxy.litellm_setup`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import orjson

from proxy.config import Config, Upstream
from proxy.dialects.openai.shared import openai_error_body
from proxy.errors import APIError, InvalidRequest, NotFound, StreamBroken, UpstreamTimeout
from proxy.upstream.answer import UpstreamResponse
from proxy.upstream.client import UpstreamClient
from proxy.upstream.litellm_errors import Failure, failure
from proxy.upstream.litellm_setup import (
    check_providers,
    close_clients,
    load_litellm,
    loaded,
    warm_up,
)

log = logging.getLogger("compaction_proxy")

# Chat completions fields litellm translates for the provider; any other gets a 400.
REQUEST_FIELDS = frozenset(
    {
        "messages",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "functions",
        "function_call",
        "response_format",
        "stream",
        "stream_options",
        "max_tokens",
        "max_completion_tokens",
        "temperature",
        "top_p",
        "n",
        "stop",
        "seed",
        "presence_penalty",
        "frequency_penalty",
        "logit_bias",
        "logprobs",
        "top_logprobs",
        "user",
        "reasoning_effort",
        "thinking",
        "modalities",
        "audio",
        "prediction",
        "web_search_options",
    }
)
# The model comes from the route; OpenAI's stored-completion bookkeeping means nothing to
# other providers.
IGNORED_FIELDS = frozenset({"model", "metadata", "store", "service_tier", "prompt_cache_key"})
_ANSWER_FIELDS = ("id", "object", "created", "model", "system_fingerprint", "choices", "usage")
_EPHEMERAL = {"type": "ephemeral"}
_JSON = [("Content-Type", "application/json")]
_SSE = [("Content-Type", "text/event-stream; charset=utf-8")]


class LiteLLMTransport:
    """`UpstreamClient.open` for upstreams of kind litellm (a `proxy.upstream.Transport`)."""

    def __init__(self, config: Config, headings: tuple[str, ...]) -> None:
        self.config = config
        # How the engine's own messages (summary, digest, anchors) begin: the stable prefix
        # marked for the provider's cache. Given by the caller: transports know no engine.
        self.headings = headings

    def load(self) -> None:
        """Import litellm and check the config's provider models (at start-up)."""
        check_providers(self.config)

    async def warm_up(self) -> None:
        await warm_up(self.config)

    async def close(self) -> None:
        await close_clients()

    async def open(
        self,
        upstream: Upstream,
        method: str,
        path: str,
        query: str,
        headers: list[tuple[str, str]],
        body: bytes | None,
        *,
        reserved_output: int | None,
    ) -> UpstreamResponse:
        """litellm's answer to a chat completion; no client header goes to the provider."""
        if (method, path) != ("POST", "/chat/completions"):
            # models, embeddings, files...: each provider has its own, or none.
            return Whole.error(
                NotFound(
                    f"Invalid URL ({method} /v1{path}): upstream {upstream.name!r} is of kind "
                    "litellm, which serves only POST /v1/chat/completions"
                )
            )
        try:
            arguments = self.arguments(upstream, body or b"", reserved_output)
        except InvalidRequest as exc:
            return Whole.error(exc)
        litellm = loaded() or await asyncio.to_thread(load_litellm)
        stream = None
        try:
            async with asyncio.timeout(upstream.timeouts.first_byte):
                answer = await litellm.acompletion(**arguments)
                if not arguments.get("stream"):
                    return Whole(200, orjson.dumps(_answer(answer)), _JSON)
                stream = answer
                first = await anext(stream, None)
        except TimeoutError:
            await _aclose(stream)
            seconds = upstream.timeouts.first_byte
            return Whole.error(
                UpstreamTimeout(f"upstream {upstream.name!r} sent no response within {seconds:g} s")
            )
        except Exception as exc:
            await _aclose(stream)
            log.info("provider error", extra={"upstream": upstream.name, "error": _name(exc)})
            return Whole.failed(failure(exc, upstream))
        except BaseException:  # cancelled: the client went away
            await _aclose(stream)
            raise
        return Streamed(stream, first, _wants_usage(arguments), upstream)

    def arguments(
        self, upstream: Upstream, body: bytes, reserved_output: int | None
    ) -> dict[str, Any]:
        """`litellm.acompletion`'s keyword arguments for a chat completions body."""
        try:
            request = orjson.loads(body)
        except orjson.JSONDecodeError:
            request = None
        if not isinstance(request, dict) or not isinstance(request.get("model"), str):
            raise InvalidRequest("The request body must be a JSON object with a model.")
        unknown = sorted(request.keys() - REQUEST_FIELDS - IGNORED_FIELDS)
        if unknown:
            raise InvalidRequest(
                f"Unrecognized request argument supplied: {', '.join(unknown)}", param=unknown[0]
            )
        model = self.config.provider_model(upstream, request["model"])
        arguments = {k: v for k, v in request.items() if k in REQUEST_FIELDS}
        if not arguments.get("stream"):
            arguments.pop("stream_options", None)
        capped = request.get("max_tokens") is not None
        if not capped and request.get("max_completion_tokens") is None and reserved_output:
            # litellm would otherwise ask providers that require a cap (Anthropic) for the
            # model's whole max output, which they count against the window.
            arguments["max_tokens"] = reserved_output
        messages = arguments.get("messages")
        # A client that marks its own cache breakpoints keeps them as they are.
        marks = upstream.caches_prompt(model) and b'"cache_control"' not in body
        if marks and isinstance(messages, list):
            arguments["messages"] = cache_marked(messages, self.headings)
        timeouts = upstream.timeouts
        return {
            **arguments,
            **upstream.provider_params,
            "model": model,
            "api_key": upstream.api_key,  # None: the provider's own from the environment
            "api_base": upstream.base_url or None,
            "timeout": timeouts.first_byte,
            "num_retries": 0,  # clients retry; the proxy does not multiply their attempts
            "max_retries": 0,
            "drop_params": True,  # what a provider does not support is left out
        }


def register(
    client: UpstreamClient, config: Config, headings: tuple[str, ...]
) -> LiteLLMTransport | None:
    """The transport of kind litellm on `client`, when the config has such an upstream (only
    then is litellm imported)."""
    if not any(u.kind == "litellm" for u in config.upstreams.values()):
        return None
    transport = client.transports["litellm"] = LiteLLMTransport(config, headings)
    return transport


def cache_marked(messages: list[Any], headings: tuple[str, ...]) -> list[Any]:
    """`messages` with the stable prefix marked for the provider's prompt cache: the
    compaction header (summary, digest, anchors) and the last message of the turns before the
    current one (the last assistant message), which every later request replays unchanged."""
    marks = {
        i
        for i, m in enumerate(messages)
        if isinstance(m, dict)
        and isinstance(m.get("content"), str)
        and m["content"].startswith(headings)
    }
    marks = set(sorted(marks)[:1])
    for i in range(len(messages) - 1, -1, -1):
        if isinstance(messages[i], dict) and messages[i].get("role") == "assistant":
            marks.add(i)
            break
    return [{**m, "cache_control": _EPHEMERAL} if i in marks else m for i, m in enumerate(messages)]


class Whole:
    """An answer that is one body: a chat completion or an error."""

    def __init__(self, status: int, body: bytes, headers: list[tuple[str, str]]) -> None:
        self.status = status
        self.body = body
        self.headers = headers

    @classmethod
    def error(cls, error: APIError) -> Whole:
        return cls(error.status_code, openai_error_body(error), _JSON)

    @classmethod
    def failed(cls, failed: Failure) -> Whole:
        headers = _JSON + ([("Retry-After", failed.retry_after)] if failed.retry_after else [])
        return cls(failed.error.status_code, openai_error_body(failed.error), headers)

    async def chunks(self, idle_timeout: float) -> AsyncIterator[bytes]:
        yield self.body

    def release(self) -> None:
        pass

    def close(self) -> None:
        pass


class Streamed:
    """litellm's stream of chunks as SSE, event by event as litellm yields them."""

    status = 200
    headers = _SSE

    def __init__(self, stream: Any, first: Any, usage: bool, upstream: Upstream) -> None:
        self._stream = stream
        self._first = first
        self._usage = usage  # the usage chunk only when the client asked for it
        self._upstream = upstream
        self._closing: asyncio.Task[None] | None = None

    async def chunks(self, idle_timeout: float) -> AsyncIterator[bytes]:
        try:
            chunk = self._first
            while chunk is not None:
                event = _chunk(chunk, self._usage)
                if event is not None:
                    yield b"data: " + orjson.dumps(event) + b"\n\n"
                try:
                    async with asyncio.timeout(idle_timeout):
                        chunk = await anext(self._stream, None)
                except Exception as exc:
                    # An error event, then the connection drops: nothing that looks complete.
                    if isinstance(exc, TimeoutError):
                        reason = f"no data for {idle_timeout:g} s"
                        name = self._upstream.name
                        error: APIError = UpstreamTimeout(f"upstream {name!r}: {reason}")
                    else:
                        reason, error = _name(exc), failure(exc, self._upstream).error
                    yield b"data: " + openai_error_body(error) + b"\n\n"
                    raise StreamBroken(reason) from None
            yield b"data: [DONE]\n\n"
        finally:
            await self._aclose()

    def release(self) -> None:
        self.close()

    def close(self) -> None:
        """Done with it: litellm's stream is closed (in the background: this is sync)."""
        if self._stream is not None and self._closing is None:
            self._closing = asyncio.get_running_loop().create_task(self._aclose())

    async def _aclose(self) -> None:
        stream, self._stream = self._stream, None
        await _aclose(stream)


async def _aclose(stream: Any) -> None:
    if stream is not None:
        await stream.aclose()


def _answer(response: Any) -> dict[str, Any]:
    """A litellm ModelResponse as OpenAI's `chat.completion` (litellm's own extras left out)."""
    data = response.model_dump(exclude_none=True)
    answer = {key: data[key] for key in _ANSWER_FIELDS if key in data}
    for choice in answer.get("choices", []):
        message = choice.get("message")
        if isinstance(message, dict):
            message.setdefault("content", None)
    return answer


def _chunk(chunk: Any, usage: bool) -> dict[str, Any] | None:
    """A litellm stream chunk as OpenAI's `chat.completion.chunk`; None when nothing is left
    (a usage chunk the client did not ask for)."""
    data = chunk.model_dump(exclude_none=True)
    event = {key: data[key] for key in _ANSWER_FIELDS if key in data}
    event.setdefault("choices", [])
    if not usage:
        event.pop("usage", None)
        if not event["choices"]:
            return None
    return event


def _wants_usage(arguments: dict[str, Any]) -> bool:
    options = arguments.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True


def _name(exc: BaseException) -> str:
    return type(exc).__name__
