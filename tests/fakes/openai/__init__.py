"""A strict fake of the OpenAI API, for the test suite and the benchmarks.

It validates, counts and streams like the real API where a proxy can get it wrong (tool pairing,
the context window, SSE framing, error bodies) and misbehaves on request::

    with FakeUpstream(windows={"small-8k": 8192}) as up:
        client = openai.OpenAI(base_url=up.base_url, api_key="sk-test", max_retries=0)

It serves ``POST /v1/chat/completions`` (``chat.py``), ``POST /v1/responses`` and
``POST /v1/responses/compact`` (``responses.py``, whose docstring lists the facts it relies on,
and ``responses_input.py``),
``POST /v1/embeddings`` and ``GET /v1/models``, all on one base URL as the real host does.
What the Responses API remembers (stored responses, the items it produced, the prompt cache) is
``up.memory``; ``up.compact_calls`` counts the compactions.

Behaviours come from the ``x-fake-behavior`` request header, else from ``up.behavior``: a comma
separated list of ``hang``, ``slow-stream[:seconds]``, ``reset-mid-stream[:events]``,
``status:NNN``, ``tool-call``, ``gzip``, ``redirect``. Settings (``behavior``, ``summarizer``,
``summary_delay``, ``script``, ``stream_delay``, ``api_key``) may be changed between requests.

A ``script`` (a scripted model, as bench/agent_clients.py drives real agent clients with) answers
Responses requests that are not summaries: a ``Scripted`` call of one of the request's tools, or
a text. ``up.answered`` keeps the usage of every answer with its request, ``up.rejected`` counts
the API errors.

Summary requests (header ``x-compaction-summary: 1``, or a system or developer message, or
Responses ``instructions``, starting with ``SUMMARY_PROMPT_PREFIX``) are answered by the
``summarizer`` hook: a string is the reply, None an empty reply, an Exception (returned or raised)
a 500.

``python -m tests.fakes.openai --port 8001 --window small-8k=8192`` (from the repository root)
serves it until interrupted.
"""

from tests.fakes.openai.chat import (
    check_window,
    count_prompt,
    count_prompt_tokens,
    max_output,
    validate_chat,
)
from tests.fakes.openai.common import (
    IMAGE_TOKENS,
    SUMMARY_HEADER,
    SUMMARY_PROMPT_PREFIX,
    ApiError,
    count_text,
    digest,
    encoding_name,
    is_summary_request,
    reply_text,
    text_of,
)
from tests.fakes.openai.responses import REASONING_TOKENS
from tests.fakes.openai.responses_input import (
    ENCRYPTED_TOKENS,
    count_input_tokens,
    is_reasoning,
    validate_responses,
)
from tests.fakes.openai.server import FakeUpstream

__all__ = [
    "ENCRYPTED_TOKENS",
    "IMAGE_TOKENS",
    "REASONING_TOKENS",
    "SUMMARY_HEADER",
    "SUMMARY_PROMPT_PREFIX",
    "ApiError",
    "FakeUpstream",
    "check_window",
    "count_input_tokens",
    "count_prompt",
    "count_prompt_tokens",
    "count_text",
    "digest",
    "encoding_name",
    "is_reasoning",
    "is_summary_request",
    "max_output",
    "reply_text",
    "text_of",
    "validate_chat",
    "validate_responses",
]
