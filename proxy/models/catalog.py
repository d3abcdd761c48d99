"""Model windows from the model map litellm ships, read without importing litellm.

Importing litellm costs memory and seconds (bench/README.md, "Upstreams of kind litellm"); its
map is a plain JSON file in the package.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import logging
import re
import threading
from pathlib import Path
from typing import Any

import orjson

log = logging.getLogger(__name__)

MAP_FILE = "model_prices_and_context_window_backup.json"
# Snapshot suffixes: gpt-4o-2024-08-06, claude-3-opus-20240229, gpt-4-0613, gemini...@20240101.
_DATED = re.compile(r"(?:-\d{4}-\d{2}-\d{2}|-\d{8}|-\d{4}|@\d{8})$")


@dataclasses.dataclass(frozen=True, slots=True)
class ModelInfo:
    context_window: int | None = None
    max_output_tokens: int | None = None


UNKNOWN = ModelInfo()


class ModelCatalog:
    """Context window and max output of a model name, from litellm's model map."""

    def __init__(self, path: str | Path | None = None, *, memo_size: int = 4096) -> None:
        self._path = Path(path) if path is not None else _shipped_map()
        self._models: dict[str, ModelInfo] | None = None
        self._loading = threading.Lock()
        # Model names come from clients: the memo is bounded.
        self._memo = functools.lru_cache(maxsize=memo_size)(self._resolve)

    def lookup(self, model: str) -> ModelInfo:
        """The model as given, then without provider prefixes, then a snapshot's base name."""
        found = self._memo(model)
        return found[1] if found else UNKNOWN

    def name(self, model: str) -> str | None:
        """The name the map knows `model` by (found as `lookup` finds it), None when it does
        not know it: one of the map's own names, whatever a client sent."""
        found = self._memo(model)
        return found[0] if found else None

    def _resolve(self, model: str) -> tuple[str, ModelInfo] | None:
        models = self._load()
        names = [model]
        while "/" in names[-1]:
            names.append(names[-1].split("/", 1)[1])
        names += [_DATED.sub("", name) for name in names if _DATED.search(name)]
        return next(((name, models[name]) for name in names if name in models), None)

    def _load(self) -> dict[str, ModelInfo]:
        with self._loading:
            if self._models is None:
                self._models = _read(self._path)
            return self._models


def _shipped_map() -> Path | None:
    # find_spec on a top-level package locates it without importing it.
    spec = importlib.util.find_spec("litellm")
    locations = spec.submodule_search_locations if spec else None
    return Path(locations[0], MAP_FILE) if locations else None


def _read(path: Path | None) -> dict[str, ModelInfo]:
    if path is None:
        log.warning("litellm is not installed: no model map, windows come from the config")
        return {}
    try:
        data = orjson.loads(path.read_bytes())
    except (OSError, ValueError) as error:  # missing, unreadable, not JSON
        log.warning("model map %s unreadable (%s): windows come from the config", path, error)
        return {}
    if not isinstance(data, dict):
        log.warning("model map %s is not a JSON object: windows come from the config", path)
        return {}
    models: dict[str, ModelInfo] = {}
    for name, entry in data.items():
        if isinstance(entry, dict):
            info = ModelInfo(
                _tokens(entry.get("max_input_tokens")) or _tokens(entry.get("max_tokens")),
                _tokens(entry.get("max_output_tokens")),
            )
            if info != UNKNOWN:
                models[name] = info
    return models


def _tokens(value: Any) -> int | None:
    # The map has placeholders such as "max input tokens, if the provider specifies it".
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
