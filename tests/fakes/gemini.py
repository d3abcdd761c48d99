"""A strict fake of Google's Gemini API (`generateContent`), for upstreams of kind litellm.

It validates what a translation from chat completions can get wrong (field names, roles, the
order of function calls and responses, the input window) and answers, streams and fails like
the real API::

    with FakeGemini(windows={"gemini-2.5-flash": 8192}, api_key="gk-test") as up:
        # litellm: model="gemini/gemini-2.5-flash", api_base=up.base_url, api_key="gk-test"

Endpoints: ``POST /v1beta/models/{model}:generateContent`` and
``POST /v1beta/models/{model}:streamGenerateContent?alt=sse``; any other path is a 404.

Facts of the real API it relies on (the API reference and error texts users reported verbatim):

- The key comes in ``x-goog-api-key`` or ``?key=``: none is a 403 PERMISSION_DENIED, a wrong one
  a 400 INVALID_ARGUMENT "API key not valid. Please pass a valid API key.". Errors are
  ``{"error": {"code", "message", "status"}}``: 400 INVALID_ARGUMENT, 403 PERMISSION_DENIED,
  404 NOT_FOUND, 429 RESOURCE_EXHAUSTED, 500 INTERNAL, 503 UNAVAILABLE.
- Bodies are protobuf JSON: each field in lowerCamelCase or snake_case; an unknown one is
  ``Invalid JSON payload received. Unknown name "x" at 'path': Cannot find field.``
- ``contents`` is a non-empty list of turns with role ``user`` or ``model`` and non-empty
  ``parts``; a part holds exactly one of text, inlineData, fileData, functionCall,
  functionResponse (plus ``thought`` / ``thoughtSignature``). A function call turn must follow a
  user turn or a function response turn; a function response turn must follow a function call
  turn and answer each of its calls.
- ``The input token count (N) exceeds the maximum number of tokens allowed (W).`` when the
  input alone is over the window (the output does not count against it).
- Answers: ``candidates[0].content.parts``, ``finishReason`` STOP or MAX_TOKENS,
  ``usageMetadata`` (promptTokenCount, candidatesTokenCount, totalTokenCount); a stream is SSE
  ``data: <GenerateContentResponse>`` events, each with the usage so far.

Counting: tiktoken ``cl100k_base`` tokens of each text part plus 3 per part, 258 per image:
unlike the proxy's own estimate on purpose, so that calibration is exercised.
Simplifications: no ``countTokens``, ``models`` listing, caching or safety ratings; streaming
only as SSE. Summary requests (a system instruction starting with ``SUMMARY_PROMPT_PREFIX``)
are answered by the ``summarizer`` hook. Behaviours come from the ``x-fake-behavior`` header,
else ``up.behavior``: a comma separated list of ``hang``, ``status:NNN``, ``tool-call``,
``error-mid-stream[:events]``.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping
from typing import Any, Unpack

import orjson
from aiohttp import web

from tests.fakes.base import Behaviors, FakeAPI, Settings
from tests.fakes.openai import SUMMARY_PROMPT_PREFIX, count_text, digest
from tests.fakes.openai.common import sample_arguments

IMAGE_TOKENS, PART_TOKENS = 258, 3  # an image; each part's framing
_STATUS = {400: "INVALID_ARGUMENT", 403: "PERMISSION_DENIED", 404: "NOT_FOUND"}
_STATUS |= {429: "RESOURCE_EXHAUSTED", 500: "INTERNAL", 503: "UNAVAILABLE"}
_TOP = {"contents", "systemInstruction", "tools", "toolConfig", "generationConfig"}
_TOP |= {"safetySettings", "cachedContent", "labels"}
_DATA = {"text", "inlineData", "fileData", "functionCall", "functionResponse"}
_PART = _DATA | {"thought", "thoughtSignature", "videoMetadata"}
_GENERATION = {"stopSequences", "responseMimeType", "responseSchema", "responseJsonSchema"}
_GENERATION |= {"candidateCount", "maxOutputTokens", "temperature", "topP", "topK", "seed"}
_GENERATION |= {"presencePenalty", "frequencyPenalty", "thinkingConfig", "responseModalities"}
_TOOL = {"functionDeclarations", "googleSearch", "codeExecution", "urlContext"}
_DECLARATION = {"name", "description", "parameters", "parametersJsonSchema", "response"}
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.:-]{0,63}")
_ORDER_CALL = (
    "Please ensure that function call turn comes immediately after a user turn or after a "
    "function response turn."
)
_ORDER_RESPONSE = (
    "Please ensure that function response turn comes immediately after a function call turn."
)
_COUNT_RESPONSE = (
    "Please ensure that the number of function response parts is equal to the number of "
    "function call parts of the function call turn."
)

_BEHAVIORS: Behaviors = {"hang": str, "status": int, "tool-call": str, "error-mid-stream": int}


class GeminiError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message

    def body(self) -> bytes:
        error = {"code": self.code, "message": self.message, "status": _STATUS.get(self.code, "")}
        return orjson.dumps({"error": error})

    def response(self) -> web.Response:
        return web.Response(body=self.body(), status=self.code, content_type="application/json")


def _camel(key: str) -> str:
    head, *rest = key.split("_")
    return head + "".join(word.title() for word in rest)


def _fields(value: Any, known: set[str], where: str) -> dict[str, Any]:
    """An object's fields by their lowerCamelCase names; a 400 for an unknown one."""
    if not isinstance(value, dict):
        raise GeminiError(400, f"Invalid value at '{where}': expected an object.")  # approximate
    fields = {}
    for key, item in value.items():
        name = _camel(key)
        if name not in known:
            at = f" at '{where}'" if where else ""
            raise GeminiError(
                400, f'Invalid JSON payload received. Unknown name "{key}"{at}: Cannot find field.'
            )
        fields[name] = item
    return fields


def _parts(value: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not value:
        raise GeminiError(
            400, f"* GenerateContentRequest.{where}: contents.parts must not be empty."
        )
    parts = [_fields(p, _PART, f"{where}[{i}]") for i, p in enumerate(value)]
    for i, part in enumerate(parts):
        if len(_DATA & part.keys()) != 1:
            raise GeminiError(
                400,
                f"* GenerateContentRequest.{where}[{i}].data: required oneof field 'data' "
                "must have one initialized field",
            )
    return parts


def _kind(parts: list[dict[str, Any]]) -> str:
    if any("functionCall" in p for p in parts):
        return "call"
    return "response" if any("functionResponse" in p for p in parts) else "text"


def validate(body: Any) -> tuple[list[tuple[str, list[dict[str, Any]]]], dict[str, Any]]:
    """The turns (role, parts) and the top-level fields of a request; GeminiError if invalid."""
    top = _fields(body, _TOP, "")
    contents = top.get("contents")
    if not isinstance(contents, list) or not contents:
        raise GeminiError(400, "* GenerateContentRequest.contents: contents is not specified")
    turns = []
    for i, content in enumerate(contents):
        turn = _fields(content, {"role", "parts"}, f"contents[{i}]")
        role = turn.get("role", "user")
        if role not in ("user", "model"):
            raise GeminiError(400, "Please use a valid role: user, model.")
        turns.append((role, _parts(turn.get("parts"), f"contents[{i}].parts")))
    for i, (role, parts) in enumerate(turns):
        kind, before = _kind(parts), _kind(turns[i - 1][1]) if i else None
        if kind == "call" and (role != "model" or before not in ("text", "response")):
            raise GeminiError(400, _ORDER_CALL)
        if kind == "response" and (before != "call" or turns[i - 1][0] != "model"):
            raise GeminiError(400, _ORDER_RESPONSE)
        if before == "call":  # every call answered by the next turn
            calls = sum("functionCall" in p for p in turns[i - 1][1])
            if sum("functionResponse" in p for p in parts) != calls:
                raise GeminiError(400, _COUNT_RESPONSE)
    if "systemInstruction" in top:
        system = _fields(top["systemInstruction"], {"role", "parts"}, "system_instruction")
        top["systemInstruction"] = _parts(system.get("parts"), "system_instruction.parts")
    top["declarations"] = []
    for i, tool in enumerate(top.get("tools") or []):
        fields = _fields(tool, _TOOL, f"tools[{i}]")
        for j, declaration in enumerate(fields.get("functionDeclarations") or []):
            where = f"tools[{i}].function_declarations[{j}]"
            top["declarations"].append(_fields(declaration, _DECLARATION, where))
            name = top["declarations"][-1].get("name")
            if not isinstance(name, str) or not _NAME.fullmatch(name):
                raise GeminiError(
                    400,
                    f"* GenerateContentRequest.tools[{i}].function_declarations[{j}].name: "
                    "Invalid function name.",
                )  # approximate
    config = _fields(top.get("generationConfig") or {}, _GENERATION, "generation_config")
    limit = config.get("maxOutputTokens")
    if limit is not None and (not isinstance(limit, int) or limit <= 0):
        raise GeminiError(
            400,
            "* GenerateContentRequest.generation_config.max_output_tokens: "
            "max_output_tokens must be positive.",
        )  # approximate
    top["generationConfig"] = config
    calling = _fields(top.get("toolConfig") or {}, {"functionCallingConfig"}, "tool_config")
    top["mode"] = (calling.get("functionCallingConfig") or {}).get("mode")
    return turns, top


def count(turns: list[tuple[str, list[dict[str, Any]]]], top: Mapping[str, Any]) -> int:
    parts = [p for _, ps in turns for p in ps] + list(top.get("systemInstruction") or [])
    total = 0
    for part in parts:
        if "text" in part:
            total += PART_TOKENS + count_text(str(part["text"]), "cl100k_base")
        elif "inlineData" in part or "fileData" in part:
            total += IMAGE_TOKENS
        else:
            total += PART_TOKENS + count_text(orjson.dumps(part).decode(), "cl100k_base")
    tools = top.get("tools")
    return total + (count_text(orjson.dumps(tools).decode(), "cl100k_base") if tools else 0)


def _summary(body: dict[str, Any]) -> str:
    return f"Summary of {len(body['contents'])} turns."


class FakeGemini(FakeAPI):
    """The fake API on 127.0.0.1, served from a background thread with its own event loop; its
    `base_url` is what litellm's ``api_base`` takes."""

    api_path = "/v1beta"
    known_behaviors = _BEHAVIORS
    error_type = GeminiError

    def __init__(self, *, default_window: int = 1_048_576, **settings: Unpack[Settings]) -> None:
        settings.setdefault("summarizer", _summary)
        super().__init__(default_window=default_window, max_body_bytes=100 * 2**20, **settings)

    def reset(self) -> None:
        """Forget the requests and the counters, and the behaviour."""
        with self._changed:
            self._forget()
        self.behavior = ""

    def _error_response(self, request: web.Request, error: Exception) -> web.StreamResponse:
        assert isinstance(error, GeminiError)
        return error.response()

    def _invalid(self, message: str) -> Exception:
        return GeminiError(400, message)

    def _failed(self) -> Exception:
        return GeminiError(500, "Internal error encountered.")

    async def _respond(
        self, request: web.Request, raw: bytes, body: Any, behaviors: dict[str, str]
    ) -> web.StreamResponse:
        model, _, method = request.path.removeprefix("/v1beta/models/").partition(":")
        stream = method == "streamGenerateContent" and request.query.get("alt") == "sse"
        if (
            request.method != "POST"
            or not request.path.startswith("/v1beta/models/")
            or not (method == "generateContent" or stream)
        ):
            raise GeminiError(
                404,
                f"models/{model} is not found for API version v1beta, or is not supported "
                f"for {method}.",
            )
        key = request.headers.get("x-goog-api-key") or request.query.get("key")
        if self.api_key is not None and not key:
            raise GeminiError(
                403,
                "Method doesn't allow unregistered callers (callers without established "
                "identity). Please use API Key or other form of API consumer identity to call "
                "this API.",
            )
        if self.api_key is not None and key != self.api_key:
            raise GeminiError(400, "API key not valid. Please pass a valid API key.")
        if "hang" in behaviors:
            await asyncio.Event().wait()
        if "status" in behaviors:
            raise GeminiError(int(behaviors["status"]), f"Fake error {behaviors['status']}.")
        turns, top = validate(body)
        tokens = count(turns, top)
        window = self.window_of(model)
        if tokens > window:
            raise GeminiError(
                400,
                f"The input token count ({tokens}) exceeds the maximum number of tokens "
                f"allowed ({window}).",
            )
        parts, finish = await self._reply(body, turns, top, tokens, "tool-call" in behaviors)
        usage = {"promptTokenCount": tokens}
        if not stream:
            output = sum(count_text(orjson.dumps(p).decode(), "cl100k_base") for p in parts)
            usage |= {"candidatesTokenCount": output, "totalTokenCount": tokens + output}
            answer = _answer(model, parts, finish, usage)
            return web.Response(body=orjson.dumps(answer), content_type="application/json")
        events = _events(model, parts, finish, usage)
        return await self.stream(request, events, behaviors, "text/event-stream", _overloaded)

    async def _reply(
        self,
        body: Any,
        turns: list[tuple[str, list[dict[str, Any]]]],
        top: dict[str, Any],
        tokens: int,
        tool_call: bool,
    ) -> tuple[list[dict[str, Any]], str]:
        system = "".join(str(p.get("text", "")) for p in top.get("systemInstruction") or [])
        if system.startswith(SUMMARY_PROMPT_PREFIX):
            text = await self.summarize(body)
        else:
            declared, (last_role, last_parts) = top["declarations"], turns[-1]
            wanted = tool_call or top["mode"] == "ANY"
            if declared and wanted and last_role == "user" and _kind(last_parts) == "text":
                function = declared[0]
                schema = function.get("parameters") or function.get("parametersJsonSchema") or {}
                args = orjson.loads(sample_arguments(schema))
                return [{"functionCall": {"name": function["name"], "args": args}}], "STOP"
            last = "".join(
                str(p.get("text", "")) for _, ps in turns for p in ps if _kind(ps) == "text"
            )
            text = f"Fake Gemini reply to {digest(last)}: {tokens} prompt tokens."
        limit = top["generationConfig"].get("maxOutputTokens")
        words = text.split(" ")
        if limit is not None and len(words) > limit:
            return [{"text": " ".join(words[:limit])}], "MAX_TOKENS"
        return [{"text": text}], "STOP"


def _events(
    model: str, parts: list[dict[str, Any]], finish: str, usage: dict[str, int]
) -> list[bytes]:
    """A streamed answer's events: a text part word by word, others whole, each with the usage
    so far."""
    pieces: list[dict[str, Any]] = []
    for part in parts:
        if "text" in part:
            words = part["text"].split(" ")
            pieces += [{"text": w if i == 0 else " " + w} for i, w in enumerate(words)]
        else:
            pieces.append(part)
    events, output = [], 0
    for i, piece in enumerate(pieces):
        output += count_text(orjson.dumps(piece).decode(), "cl100k_base")
        counts = usage | {
            "candidatesTokenCount": output,
            "totalTokenCount": usage["promptTokenCount"] + output,
        }
        last = i == len(pieces) - 1
        answer = _answer(model, [piece], finish if last else None, counts)
        events.append(b"data: " + orjson.dumps(answer) + b"\r\n\r\n")
    return events


def _overloaded(response: web.StreamResponse) -> bytes:
    """The event that ends a stream the API got overloaded in (``error-mid-stream``)."""
    error = GeminiError(503, "The model is overloaded. Please try again later.")
    return b"data: " + error.body() + b"\r\n\r\n"


def _answer(
    model: str, parts: list[dict[str, Any]], finish: str | None, usage: dict[str, int]
) -> dict[str, Any]:
    candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
    if finish is not None:
        candidate["finishReason"] = finish
    return {"candidates": [candidate], "usageMetadata": usage, "modelVersion": model}
