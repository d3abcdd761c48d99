"""What a model allows: its context window, its max output and the counter for its tokens
(and what that counter's calibration is learnt for).

From the config's per-model overrides first, then litellm's model map, then the config's
default window. A model an upstream of kind litellm renames (`provider_model`) is looked up
under the provider's name.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Literal

from proxy.config import Config, Upstream
from proxy.models.calibration import Counting
from proxy.models.catalog import ModelCatalog
from proxy.models.tokens import TokenCounter, counter_for

MAX_MEMOISED = 10_000  # model names come from clients
log = logging.getLogger("compaction_proxy")

WindowSource = Literal["config", "model-map", "default"]


@dataclasses.dataclass(frozen=True)
class Limits:
    window: int
    max_output: int | None
    counter: TokenCounter
    counting: Counting  # what the counter's calibration is learnt for
    window_source: WindowSource = "config"


class ModelLimits:
    """`limits(model)`, memoised per model name."""

    def __init__(self, config: Config, catalog: ModelCatalog | None = None) -> None:
        self.config = config
        self.catalog = catalog or ModelCatalog()
        self._limits: dict[tuple[str, str], Limits] = {}
        self.warm = False

    def warm_up(self) -> None:
        """Load the current models' tokenizer and the model map before the first request
        (older encodings load on first use: each costs tens of MB)."""
        self.limits("gpt-4o").counter.text("warm up")
        self.warm = True

    def limits(self, model: str, upstream: Upstream | None = None) -> Limits:
        """The limits of `model`; sent to `upstream`, the model map and the counter go by the
        name that upstream asks its provider for (an upstream of kind litellm may rename it)."""
        name = self.config.provider_model(upstream, model) if upstream else model
        found = self._limits.get((model, name))
        if found is None:
            override = self.config.model(model)
            info = self.catalog.lookup(name)
            window = (override and override.context_window) or info.context_window
            max_output = (override and override.max_output_tokens) or info.max_output_tokens
            counter = counter_for(
                name,
                override.counting if override else "auto",
                override.encoding if override else None,
            )
            source: WindowSource = (
                "config"
                if override and override.context_window
                else "model-map"
                if info.context_window
                else "default"
            )
            if source == "default" and len(self._limits) < MAX_MEMOISED:
                # Once per model (memoised below): a guessed window is worth an operator's look.
                log.warning(
                    "model not in the config nor the model map: default_context_window used",
                    extra={"model": name[:200], "window": self.config.default_context_window},
                )
            window = window or self.config.default_context_window
            found = Limits(window, max_output, counter, Counting.of(name, counter), source)
            if len(self._limits) < MAX_MEMOISED:
                self._limits[model, name] = found
        return found
