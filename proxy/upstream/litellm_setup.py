"""litellm, imported once and set up to stay offline and quiet.

Importing litellm costs memory and seconds (bench/README.md, "Upstreams of kind litellm"), so
only a config with an upstream of kind litellm does it, at start-up. It must fetch nothing on
its own (its model map, beta headers and tokenizers come from the package: only the configured
providers are ever contacted), and its loggers, which print request and response bodies at
debug level, are silenced.
"""

from __future__ import annotations

import importlib
import logging
import os
import threading
from typing import Any

from proxy.config import Config, ConfigError

log = logging.getLogger("compaction_proxy")

OFFLINE_ENVIRONMENT = {
    "LITELLM_OFFLINE_MODE": "true",  # nothing fetched that the config did not name
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "LITELLM_LOCAL_ANTHROPIC_BETA_HEADERS": "True",
}
_LITELLM_LOGGERS = ("LiteLLM", "LiteLLM Router", "LiteLLM Proxy")

_module: Any = None
_importing = threading.Lock()


def load_litellm() -> Any:
    """The litellm module, imported once and set up to stay offline and quiet."""
    global _module
    with _importing:
        if _module is None:
            os.environ.update(OFFLINE_ENVIRONMENT)
            module: Any = importlib.import_module("litellm")
            module.disable_hf_tokenizer_download = True
            module.suppress_debug_info = True  # no "Give Feedback / Get Help" on stdout
            module.turn_off_message_logging = True
            # Messages for OpenAI-compatible providers (`openai/`, `azure/`) go out as chat
            # completions, which every such server has, not as the Responses API, which many
            # local ones (vLLM, llama.cpp, LM Studio...) have not. litellm only has this as a
            # process-wide setting.
            module.use_chat_completions_url_for_anthropic_messages = True
            for name in _LITELLM_LOGGERS:
                logger = logging.getLogger(name)
                logger.handlers.clear()
                logger.propagate = False
                logger.disabled = True
            _module = module
        return _module


def provider_templates(config: Config) -> dict[str, str]:
    """The config's provider models whose provider it names, by where they are set (a
    template whose provider is the request's model is left out: only a request tells it)."""
    templates = {
        f"upstreams.{name}.provider_model": upstream.provider_model
        for name, upstream in config.upstreams.items()
        if upstream.kind == "litellm"
    }
    templates |= {
        f"models[{i}].provider_model": override.provider_model
        for i, override in enumerate(config.models)
    }
    return {
        where: template
        for where, template in templates.items()
        if template is not None and "{model}" not in template.split("/", 1)[0]
    }


def check_providers(config: Config) -> None:
    """ConfigError naming every provider model litellm cannot place (imports litellm; no
    network): a mistyped provider prefix fails the start, not each request."""
    litellm = load_litellm()
    problems = []
    for where, template in provider_templates(config).items():
        try:
            litellm.get_llm_provider(template.replace("{model}", "model"))
        except Exception:
            problems.append(f"{where}: litellm knows no provider for {template!r}")
    if problems:
        raise ConfigError(problems)


def loaded() -> Any:
    """The litellm module once `load_litellm` has run, else None."""
    return _module


async def warm_up(config: Config) -> None:
    """litellm imports much of itself on first use (a second or more): one answer of its
    own per provider of the config (`mock_response`: nothing is sent), streamed and not,
    loads it before the first request."""
    messages = [{"role": "user", "content": "warm-up"}]
    templates = provider_templates(config).values()
    for model in sorted({t.replace("{model}", "warm-up") for t in templates}):
        for stream in (False, True):
            try:
                answer = await load_litellm().acompletion(
                    model=model, messages=messages, mock_response="ok", stream=stream
                )
                if stream:
                    async for _ in answer:
                        pass
            except Exception as exc:  # best effort: the first request pays instead
                log.info("litellm warm-up failed", extra={"error": type(exc).__name__})


async def close_clients() -> None:
    """Close the HTTP clients litellm made on this event loop, with their pooled connections
    to the providers: litellm keeps them for the life of the process."""
    litellm = loaded()
    if litellm is None:
        return
    closer = importlib.import_module("litellm.caching.evicted_client_closer")
    cache = litellm.in_memory_llm_clients_cache
    suffix = f"-{closer.running_loop_token()}"
    for key in [k for k in cache.cache_dict if str(k).endswith(suffix)]:
        client = cache.cache_dict.pop(key)
        try:
            await client.close()
        except Exception as exc:  # closing is best effort at shutdown
            log.info("litellm client not closed", extra={"error": type(exc).__name__})
