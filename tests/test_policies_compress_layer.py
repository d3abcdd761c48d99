"""compress_tool_results and what the later layers keep of an output: levels that go up from
the original, recorded in the plan; tools and errors left alone; salient lines kept in place
by clear_tool_results and beside the summary when a block is dropped."""

from __future__ import annotations

import json

from policies import (
    ClearToolResultsParams,
    CompressToolResultsParams,
    DropToolBlocksParams,
    Plan,
    Policy,
    SummaryRequest,
    content_text,
)
from policies.compress import PREFIX
from policies.layers.compress_tool_results import compressed
from tests.test_policies_layers import SYSTEM, call, context, run

PARAMS = CompressToolResultsParams()


def log(step: int, lines: int = 250) -> str:
    rows = [f"[{i:04d}] INFO step {step} compiling module m{i}" for i in range(lines)]
    rows[lines // 2] = f"ERROR E{step:02d}: test_checkout failed"
    return "\n".join(rows)


def loop(steps: int, output=log, name: str = "bash") -> list[dict]:
    messages = [SYSTEM, {"role": "user", "content": "Fix the checkout tests."}]
    for step in range(steps):
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [call(f"c{step}", name)]},
            {"role": "tool", "tool_call_id": f"c{step}", "content": output(step)},
        ]
    return messages


def outputs(messages: list[dict], ctx) -> list[int]:
    return [p for p, m in enumerate(ctx.chain) if m["role"] == "tool" and not ctx.in_turn(p)]


async def test_a_level_begun_goes_to_every_old_output_and_the_next_only_when_over() -> None:
    messages = loop(10)
    ctx = context(messages, 16384, 0.45)
    plan, (decision,) = await run("compress_tool_results", messages, Plan(), ctx)
    olds = outputs(messages, ctx)
    assert sorted(plan.edits) == sorted(plan.levels) == olds  # the current turn's is kept
    # A log has no lossless form: lossy at once, level 2 for all was not enough, level 3 was.
    assert set(plan.levels.values()) == {3}
    at_2 = {p: compressed(ctx.chain[p], 2, PARAMS) for p in olds}
    with_2 = decision.tokens_after + sum(
        ctx.counter.message(at_2[p]) - ctx.counter.message(plan.edits[p]) for p in olds
    )
    assert with_2 > ctx.aim_tokens >= decision.tokens_after
    at_3 = [p for p in olds if plan.levels[p] == 3]
    for position in olds:
        text = plan.edits[position]["content"]
        assert text.startswith(PREFIX + "log")
        assert f"ERROR E{position // 2 - 1:02d}: test_checkout failed" in text.split("\n")
        assert plan.edits[position] == compressed(
            ctx.chain[position], plan.levels[position], PARAMS
        )
    assert decision.detail == f"{len(at_3)} at level 3"
    assert decision.tokens_after <= ctx.target_tokens
    assert Plan.from_dict(json.loads(json.dumps(plan.to_dict()))) == plan


async def test_lossless_first_where_it_is_enough() -> None:
    def records(step: int) -> str:
        rows = [{"id": i, "status": "ok", "step": step, "region": "eu-west-1"} for i in range(60)]
        return json.dumps(rows, indent=2)

    messages = loop(6, records)
    ctx = context(messages, 8192, 0.6)
    plan, _ = await run("compress_tool_results", messages, Plan(), ctx)
    assert plan.levels and set(plan.levels.values()) == {1}
    for position in plan.levels:
        data = json.loads(plan.edits[position]["content"])
        assert data["form"] == "arrays of records as columns and rows"
        assert len(data["data"]["rows"]) == 60


async def test_a_later_compaction_raises_levels_from_the_original() -> None:
    messages = loop(6)
    first, _ = await run("compress_tool_results", messages, Plan(), context(messages, 8192, 0.8))
    longer = loop(12)
    ctx = context(longer, 8192, 0.3)
    second, _ = await run("compress_tool_results", longer, first, ctx)
    raised = [p for p, level in second.levels.items() if level > first.levels.get(p, 0) > 0]
    assert raised
    for position in raised:  # the same bytes as compressing the original at that level
        level = second.levels[position]
        assert second.edits[position] == compressed(ctx.chain[position], level, PARAMS)


async def test_excluded_tools_errors_and_the_current_turn_are_left_alone() -> None:
    messages = loop(8, name="Read")
    messages[5] = {**messages[5], "is_error": True}  # the second output: an error as a whole
    ctx = context(messages, 2048)
    excluded = CompressToolResultsParams(deny_tools=("Read",))
    assert await run("compress_tool_results", messages, Plan(), ctx, excluded) == (Plan(), [])
    plan, _ = await run("compress_tool_results", messages, Plan(), ctx)
    assert 3 not in plan.edits and max(plan.edits) < ctx.turn_start
    only_json = CompressToolResultsParams(compressors=("json",))
    assert await run("compress_tool_results", messages, Plan(), ctx, only_json) == (Plan(), [])


async def test_a_text_part_is_compressed_and_the_other_parts_kept() -> None:
    image = {"type": "image_url", "image_url": {"url": "https://x.test/a.png"}}
    parts = [{"type": "text", "text": log(0)}, image]
    message = {"role": "tool", "tool_call_id": "c0", "content": parts}
    edit = compressed(message, 2, PARAMS)
    assert edit is not None and edit["content"][1] is image
    assert edit["content"][0]["text"].startswith(PREFIX)


async def test_a_cleared_output_keeps_its_salient_lines_in_place() -> None:
    messages = loop(8)
    ctx = context(messages, 2048)
    params = ClearToolResultsParams(keep_last=0)
    plan, _ = await run("clear_tool_results", messages, Plan(), ctx, params)
    assert plan.edits
    for position, edit in plan.edits.items():
        expected = f"{params.placeholder}\nERROR E{position // 2 - 1:02d}: test_checkout failed"
        assert edit["content"] == expected
    assert plan.anchor_block is None
    bare = ClearToolResultsParams(keep_last=0, salient_tokens=0)
    plan, _ = await run("clear_tool_results", messages, Plan(), ctx, bare)
    # Not kept in place: beside the summary, in the anchor block.
    assert plan.anchor_block is not None and "ERROR E00: test_checkout failed" in plan.anchor_block


async def test_a_dropped_block_leaves_its_salient_lines_beside_the_summary() -> None:
    messages = loop(8)
    messages[3] = {**messages[3], "content": "permission denied for /etc/shadow", "is_error": True}
    ctx = context(messages, 2048, policy=Policy(protect_recent_rounds=0))
    plan, _ = await run("drop_tool_blocks", messages, Plan(), ctx, DropToolBlocksParams(1))
    assert plan.anchor_block is not None
    kept = plan.anchor_block.split("\n")
    assert kept[0] == "permission denied for /etc/shadow"  # an error as a whole
    dropped = [
        p for p, edit in plan.edits.items() if edit is None and ctx.chain[p]["role"] == "tool"
    ]
    assert kept[1:] == [f"ERROR E{p // 2 - 1:02d}: test_checkout failed" for p in dropped[1:]]


async def test_truncation_leaves_compressed_outputs_alone() -> None:
    messages = loop(10, lambda step: log(step, 1000))
    ctx = context(messages, 8192, 0.3)
    one_level = CompressToolResultsParams(levels=(1000,))  # outputs over truncation's threshold
    plan, _ = await run("compress_tool_results", messages, Plan(), ctx, one_level)
    assert plan.levels
    after, _ = await run("truncate_tool_fields", messages, plan, context(messages, 2048))
    assert {p: after.edits[p] for p in plan.levels} == {p: plan.edits[p] for p in plan.levels}


async def test_summaries_are_made_from_the_originals() -> None:
    seen: list[SummaryRequest] = []

    async def summarizer(request: SummaryRequest) -> str:
        seen.append(request)
        return "Summary: tests were fixed."

    messages = loop(6)
    messages.insert(-4, {"role": "user", "content": "Go on."})
    plan, _ = await run("compress_tool_results", messages, Plan(), context(messages, 8192, 0.6))
    ctx = context(messages, 2048, summarizer=summarizer, policy=Policy(protect_recent_rounds=1))
    summarized, _ = await run("summarize", messages, plan, ctx)
    assert summarized.cut > min(plan.levels)
    (request,) = seen
    texts = [content_text(m["content"]) for m in request.evicted if m["role"] == "tool"]
    assert texts and all(not text.startswith(PREFIX) for text in texts)
    assert texts == [
        content_text(ctx.chain[p]["content"]) for p in request.positions if p in plan.levels
    ]
