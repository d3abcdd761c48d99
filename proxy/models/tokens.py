"""The proxy's token counter: exact with tiktoken for OpenAI models, chars/4 for the rest.

`TokenCounter` implements the engine's `policies.Counter` protocol; what needs no tokenizer
(estimates for images, audio and files) lives with that protocol in `policies/counting.py`.
Counts follow OpenAI's published formula (the cookbook's `num_tokens_from_messages` and
`num_tokens_for_tools`). Per-message counts are cached by content, so counting a request costs
in proportion to its new messages, not its whole history.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Literal, NamedTuple

import orjson
import tiktoken
import tiktoken.model

from policies.counting import media_tokens
from proxy.memo import Memo

Mode = Literal["exact", "estimate"]

MESSAGE_OVERHEAD = 3  # <|start|>{role}<|message|>{content}<|end|>
NAME_OVERHEAD = 1
REPLY_PRIMING = 3  # every reply is primed with <|start|>assistant<|message|>
TOOL_CALL_OVERHEAD = 3
# The tools schema is rendered into the prompt; constants from OpenAI's cookbook.
FUNC_INIT = {"o200k_base": 7}  # 10 for cl100k_base and, to err high, for the rest
PROP_INIT, PROP_KEY, ENUM_INIT, ENUM_ITEM, FUNC_END = 3, 3, -3, 3, 12

OFFLINE_ENCODINGS = frozenset({"o200k_base", "o200k_harmony", "cl100k_base", "p50k_base"})
DEFAULT_ENCODING = "o200k_base"
_ENCODING_URL = "https://openaipublic.blob.core.windows.net/encodings/{}.tiktoken"
_REQUIRED_FILES = ("o200k_base", "cl100k_base")


class CacheInfo(NamedTuple):
    hits: int
    misses: int
    size: int
    maxsize: int


def configure_offline_encodings() -> None:
    """Point tiktoken at the encoding files litellm ships, unless TIKTOKEN_CACHE_DIR is set.

    tiktoken downloads its encodings on first use; this machine has no network.
    """
    if "TIKTOKEN_CACHE_DIR" in os.environ:
        return
    # find_spec on a top-level package locates it without importing it (see catalog.py).
    spec = importlib.util.find_spec("litellm")
    locations = spec.submodule_search_locations if spec else None
    directory = Path(locations[0], "litellm_core_utils", "tokenizers") if locations else None
    missing = [
        name
        for name in _REQUIRED_FILES
        if directory is None or not (directory / _cache_key(name)).is_file()
    ]
    if directory is None or missing:
        raise RuntimeError(
            f"tiktoken encodings {', '.join(missing)} are not available offline (looked in "
            f"{directory or 'the litellm package, which is not installed'}). Install litellm "
            "(`pip install litellm`), which ships them, or set TIKTOKEN_CACHE_DIR to a "
            "directory holding tiktoken's cached encoding files."
        )
    os.environ["TIKTOKEN_CACHE_DIR"] = str(directory)


def _cache_key(encoding: str) -> str:
    """tiktoken names its cached files by the SHA-1 of their download URL."""
    url = _ENCODING_URL.format(encoding)
    return hashlib.sha1(url.encode(), usedforsecurity=False).hexdigest()


class TokenCounter:
    """Counts the prompt tokens of chat messages, exactly (tiktoken) or by estimate (chars/4);
    a `policies.Counter`."""

    def __init__(self, encoding: tiktoken.Encoding | None, *, cache_size: int = 65_536) -> None:
        self._encoding = encoding
        self._func_init = FUNC_INIT.get(encoding.name, 10) if encoding else 10
        self._memo: Memo[int] = Memo(cache_size)

    @property
    def mode(self) -> Mode:
        return "estimate" if self._encoding is None else "exact"

    @property
    def name(self) -> str:
        """The encoding's name, or "estimate"."""
        return "estimate" if self._encoding is None else self._encoding.name

    def text(self, text: str) -> int:
        if self._encoding is None:
            return -(-len(text) // 4)
        return len(self._encoding.encode_ordinary(text))

    def head(self, text: str, tokens: int) -> str:
        """The first `tokens` tokens of `text` (a prefix of it)."""
        if tokens <= 0:
            return ""
        if self._encoding is None:
            return text[: tokens * 4]
        ids = self._encoding.encode_ordinary(text)
        if len(ids) <= tokens:
            return text
        # A token boundary may split a UTF-8 sequence: drop the partial character.
        return self._encoding.decode_bytes(ids[:tokens]).decode("utf-8", "ignore")

    def message(self, message: dict[str, Any]) -> int:
        """One message, including the per-message overhead."""
        return self._cached(message, self._measure_message)

    def count(self, messages: Iterable[dict[str, Any]], *, fixed: int = 0) -> int:
        """Messages plus `fixed` (see `fixed()`): what the prompt of a request costs."""
        total = fixed
        for message in messages:
            total += self._cached(message, self._measure_message)
        return total

    def counts(self, messages: Sequence[dict[str, Any]], keys: Sequence[int]) -> list[int]:
        """Each message's tokens, given the messages' `content_keys` (computed once a request:
        this loop is the whole cost of a request that does not compact)."""
        return self._memo.each(messages, self._measure_message, keys)

    def tools(self, tools: list[dict[str, Any]] | None) -> int:
        """The tools schema (also the legacy `functions` list)."""
        return self._cached(tools, self._measure_tools) if tools else 0

    def fixed(self, body: dict[str, Any]) -> int:
        """What a request costs besides its messages: tools schema and reply priming."""
        return REPLY_PRIMING + self.tools(body.get("tools")) + self.tools(body.get("functions"))

    def json(self, value: Any) -> int:
        """A value the formula does not know (another API's tools schema, say), by its JSON
        text; memoised."""
        return self._cached(value, self._opaque)

    def cache_info(self) -> CacheInfo:
        memo = self._memo
        return CacheInfo(memo.hits, memo.misses, len(memo), memo.size)

    def _cached(self, value: Any, measure: Callable[[Any], int]) -> int:
        return self._memo.get(value, measure)

    def _measure_message(self, message: dict[str, Any]) -> int:
        total = MESSAGE_OVERHEAD
        for key, value in message.items():
            if value is None:
                continue
            if key == "content":
                total += self._content(value)
            elif key == "tool_calls" and isinstance(value, list):
                total += sum(self._tool_call(call) for call in value)
            elif key == "function_call" and isinstance(value, dict):
                total += self._call(value)
            elif key == "name" and isinstance(value, str):
                total += self.text(value) + NAME_OVERHEAD
            elif isinstance(value, str):  # role, tool_call_id and any other text field
                total += self.text(value)
        return total

    def _content(self, content: Any) -> int:
        if isinstance(content, str):
            return self.text(content)
        if isinstance(content, list):
            return sum(self._part(part) for part in content)
        return self._opaque(content)

    def _part(self, part: Any) -> int:
        if not isinstance(part, dict):
            return self._opaque(part)
        kind = part.get("type")
        value = part.get(kind) if isinstance(kind, str) else None
        if kind in ("text", "refusal") and isinstance(value, str):
            return self.text(value)
        # Images, audio and files by OpenAI's rules; a part nobody knows by its JSON.
        return media_tokens(part) or self._opaque(part)

    def _tool_call(self, call: Any) -> int:
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            return self._call(function)
        return TOOL_CALL_OVERHEAD + self._opaque(call)

    def _call(self, function: dict[str, Any]) -> int:
        name, arguments = function.get("name"), function.get("arguments")
        return (
            TOOL_CALL_OVERHEAD
            + (self.text(name) if isinstance(name, str) else 0)
            + (self.text(arguments) if isinstance(arguments, str) else self._opaque(arguments))
        )

    def _measure_tools(self, tools: Any) -> int:
        if not isinstance(tools, list):
            return self._opaque(tools)
        total = FUNC_END
        for tool in tools:
            # A tool wraps its function; an entry of the legacy `functions` list is one.
            function = tool.get("function", tool) if isinstance(tool, dict) else None
            if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                total += self._func_init + self._opaque(tool)
                continue
            description = function.get("description")
            line = function["name"]
            if isinstance(description, str) and description:
                line += ":" + description.removesuffix(".")
            parameters = function.get("parameters")
            total += self._func_init + self.text(line)
            if isinstance(parameters, dict):
                total += self._properties(parameters.get("properties"))
        return total

    def _properties(self, properties: Any) -> int:
        if not isinstance(properties, dict) or not properties:
            return 0
        total = PROP_INIT
        for key, schema in properties.items():
            total += PROP_KEY
            if not isinstance(schema, dict):
                total += self.text(str(key)) + self._opaque(schema)
                continue
            kind = schema.get("type", "")
            kind = "|".join(map(str, kind)) if isinstance(kind, list) else str(kind)
            description = str(schema.get("description", "")).removesuffix(".")
            total += self.text(f"{key}:{kind}:{description}")
            enum = schema.get("enum")
            if isinstance(enum, list) and enum:
                total += ENUM_INIT + sum(ENUM_ITEM + self.text(str(item)) for item in enum)
            # Nested objects and arrays of objects render their own properties.
            items = schema.get("items")
            total += self._properties(schema.get("properties"))
            total += self._properties(items.get("properties") if isinstance(items, dict) else None)
        return total

    def _opaque(self, value: Any) -> int:
        """Something the formula does not know: its JSON text, so it is not left out."""
        return self.text(orjson.dumps(value).decode())


def encoding_for(model: str) -> str | None:
    """tiktoken's encoding for an OpenAI model (provider prefixes ignored), or None."""
    name = model.rsplit("/", 1)[-1].lower()
    try:
        return tiktoken.model.encoding_name_for_model(name)
    except KeyError:
        return None


def counter_for(
    model: str,
    mode: Literal["auto", "exact", "estimate"] = "auto",
    encoding: str | None = None,
) -> TokenCounter:
    """The shared counter for a model: one per encoding, so their caches are shared.

    "auto" counts exactly when tiktoken knows the model (and its encoding ships offline),
    otherwise estimates; "exact" falls back to o200k_base for a model tiktoken does not know.
    """
    if mode == "estimate":
        return _shared(None)
    name = encoding or encoding_for(model)
    if mode == "auto" and encoding is None and name not in OFFLINE_ENCODINGS:
        return _shared(None)
    return _shared(name or DEFAULT_ENCODING)


@functools.cache
def _shared(encoding: str | None) -> TokenCounter:
    if encoding is None:
        return TokenCounter(None)
    configure_offline_encodings()
    loaded = tiktoken.get_encoding(encoding)
    # tiktoken keeps a Python copy of the ranks (~30 MB for o200k) only to pickle the
    # encoding, which the proxy never does; its Rust core has its own.
    loaded.__dict__.pop("_mergeable_ranks", None)
    return TokenCounter(loaded)
