"""A policy's compaction keys and layers are read from YAML and checked like every other key."""

from __future__ import annotations

import pytest

from policies import ClearToolResultsParams, LayerSpec, TrimHeadParams
from proxy.config import ConfigError, loads

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
