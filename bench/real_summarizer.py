"""A real model's summaries for the retention benches: `--summarizer-url URL --summarizer-model
NAME` name any OpenAI-compatible endpoint (its key, if it needs one, in SUMMARIZER_API_KEY),
which the proxy's own summarizer config (`summarizer.upstream`, `summarizer.model`) then asks
for every summary, while the fake upstream keeps serving the conversation itself.

The key is never in the bench's text: the config says `${SUMMARIZER_API_KEY}`, which the proxy
reads from the environment as it reads any upstream's key.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
from collections.abc import AsyncIterator
from typing import Any

import yaml

import policies
from proxy.compaction.cooldowns import Cooldowns
from proxy.compaction.summarizer import LLMSummarizer
from proxy.config import loads
from proxy.dialects import dialect_of_kind
from proxy.models.limits import ModelLimits
from proxy.observability.metrics import Metrics
from proxy.upstream.client import UpstreamClient

UPSTREAM = "summarizer"  # the summarizer's upstream in the bench's config
KEY_VARIABLE = "SUMMARIZER_API_KEY"


@dataclasses.dataclass(frozen=True)
class RealSummarizer:
    """An OpenAI-compatible endpoint and the model there that writes the summaries."""

    url: str
    model: str

    def upstream(self) -> dict[str, Any]:
        """Its entry in the config's `upstreams`."""
        entry: dict[str, Any] = {"base_url": self.url}
        if os.environ.get(KEY_VARIABLE):
            entry["api_key"] = "${" + KEY_VARIABLE + "}"
        return entry

    def settings(self) -> dict[str, Any]:
        """A policy's `summarizer` section that sends every summary to it."""
        return {"upstream": UPSTREAM, "model": self.model}

    def with_summaries(self, config: dict[str, Any]) -> dict[str, Any]:
        """`config` (a proxy config's data) with its summaries written by this model."""
        named = config.get("policies") or {"default": {}}
        return {
            **config,
            "upstreams": {**config["upstreams"], UPSTREAM: self.upstream()},
            "policies": {
                name: {**policy, "summarizer": self.settings()} for name, policy in named.items()
            },
        }

    @contextlib.asynccontextmanager
    async def summarizer(self) -> AsyncIterator[policies.Summarizer]:
        """The proxy's own summarizer, in process, built from a config that names this model."""
        config = loads(yaml.safe_dump(self.with_summaries({"upstreams": {}})), "<summarizer>")
        metrics = Metrics()
        client = UpstreamClient(metrics)
        upstream = config.upstreams[UPSTREAM]
        limits = ModelLimits(config).limits(self.model, upstream)
        try:
            yield LLMSummarizer(
                client,
                upstream,
                dialect_of_kind(upstream.kind),
                self.model,
                config.policies["default"].summarizer,
                credentials=(),
                counter=limits.counter,
                window=limits.window,
                metrics=metrics,
                cooldowns=Cooldowns(),
            )
        finally:
            await client.close()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--summarizer-url",
        help="an OpenAI-compatible base URL (…/v1) whose model writes the summaries"
        f" (its key in {KEY_VARIABLE})",
    )
    parser.add_argument("--summarizer-model", help="the model there that writes the summaries")


def from_arguments(
    parser: argparse.ArgumentParser, args: argparse.Namespace
) -> RealSummarizer | None:
    """The endpoint the arguments name; None when they name none."""
    if args.summarizer_url is None and args.summarizer_model is None:
        return None
    if args.summarizer_url is None or args.summarizer_model is None:
        parser.error("--summarizer-url and --summarizer-model go together")
    return RealSummarizer(args.summarizer_url, args.summarizer_model)
