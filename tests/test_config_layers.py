"""A policy's compaction keys and layers are read from YAML and checked like every other key."""

from __future__ import annotations

import pytest

from policies import (
    ClearToolResultsParams,
    CompressToolResultsParams,
    LayerSpec,
    TrimHeadParams,
)
from policies.compress import Limits
from proxy.config import ConfigError, load, loads

BASE = """
upstreams:
  up: {base_url: "http://127.0.0.1:9/v1"}
policies:
  default:
"""


def policy(text: str) -> str:
    return BASE + "".join(f"    {line}\n" for line in text.strip("\n").splitlines())


def test_layers_by_name_or_with_parameters() -> None:
    config = loads(
        policy(
            """
layers:
  - trim_head
  - clear_tool_results: {keep_last: 3, deny_tools: [bash]}
protect_recent_rounds: 4
anchors: ['ORDER-\\d+']
summary_role: system
"""
        )
    )
    compaction = config.policies["default"].compaction
    assert compaction.layers == (
        LayerSpec("trim_head", TrimHeadParams()),
        LayerSpec("clear_tool_results", ClearToolResultsParams(keep_last=3, deny_tools=("bash",))),
    )
    assert compaction.protect_recent_rounds == 4
    assert compaction.anchors == ("ORDER-\\d+",)
    assert compaction.summary_role == "system"


@pytest.mark.parametrize(
    ("layers", "message"),
    [
        ("[shrink]", "layers[0] (<config>, line 6): unknown layer 'shrink'"),
        ("[{trim_head: {speed: 1}}]", "layers[0].trim_head.speed (<config>, line 6): unknown key"),
        (
            "[{drop_tool_blocks: {keep_last: '5'}}]",
            "keep_last (<config>, line 6): expected an integer",
        ),
        ("[{drop_tool_blocks: {keep_last: -1}}]", "must not be negative"),
        ("[{summarize: {input_share: 2.0}}]", "input_share"),
        ("[{a: {}, b: {}}]", "a layer is its name, or a mapping of its name to its parameters"),
    ],
)
def test_bad_layers_name_the_key_and_line(layers: str, message: str) -> None:
    with pytest.raises(ConfigError) as error:
        loads(policy(f"layers: {layers}"))
    assert message in str(error.value)


def test_bad_compaction_keys_are_named() -> None:
    with pytest.raises(ConfigError) as error:
        loads(policy("anchors: ['([']\nsummary_role: robot\nprotect_rounds: 3"))
    unknown, rules = error.value.problems
    assert unknown.startswith("policies.default.protect_rounds (<config>, line 8): unknown key")
    # The policy's own rules, every one it breaks, at the policy's key and line.
    assert rules.startswith("policies.default (<config>, line 5): summary_role must be one of")
    assert "; anchor '([' is not a valid regular expression" in rules


def test_compression_is_configured_per_policy() -> None:
    config = loads(
        policy(
            """
layers:
  - compress_tool_results:
      levels: [800, 200]
      compressors: [json, log]
      deny_tools: [Read]
      limits: {context_lines: 4}
  - clear_tool_results: {salient_tokens: 0}
"""
        )
    )
    (compress, clear) = config.policies["default"].compaction.layers
    assert compress == LayerSpec(
        "compress_tool_results",
        CompressToolResultsParams(
            levels=(800, 200),
            compressors=("json", "log"),
            deny_tools=("Read",),
            limits=Limits(context_lines=4),
        ),
    )
    assert clear.params.salient_tokens == 0
    assert config.masked()["policies"]["default"]["layers"][0]["compress_tool_results"][
        "limits"
    ] == {"context_lines": 4, "warning_lines": 20, "items": 20, "blob_chars": 256}


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ("{compressors: [json, xml]}", "unknown compressors ['xml']"),
        ("{levels: [200, 800]}", "levels must be positive and decreasing"),
        ("{limits: {context_lines: -1}}", "context_lines must not be negative"),
        ("{limits: {lines: 3}}", "limits.lines (<config>, line 6): unknown key"),
    ],
)
def test_bad_compression_settings_are_named(params: str, message: str) -> None:
    with pytest.raises(ConfigError) as error:
        loads(policy(f"layers: [{{compress_tool_results: {params}}}]"))
    assert message in str(error.value)


def test_the_shipped_config_compresses_first() -> None:
    assert load().policies["default"].compaction.layers[0].name == "compress_tool_results"
