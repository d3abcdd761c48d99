"""Each compaction layer alone: the invariants of docs/compaction.md that hold per layer, as
properties over random conversations, and examples of each layer's exact output."""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies import (
    LAYERS,
    ClearToolResultsParams,
    Context,
    Decision,
    DropToolBlocksParams,
    LayerSpec,
    Plan,
    Policy,
    Summary,
    SummaryRequest,
    TruncateToolFieldsParams,
    content_text,
    make_context,
    render,
    run_layer,
)
from policies.anchors import anchor_block
from policies.layers.summarize import SummarizeParams
from policies.layers.trim_head import SHORTENED, TrimHeadParams
from policies.plan import DIGEST_HEADING, SUMMARY_HEADING
from policies.summary import TAIL_HEADING, too_short
from tests.conftest import examples
from tests.conversations import (
    ANCHOR,
    CLEARED,
    CharCounter,
    budget_for,
    conversations,
    png_data_url,
    view_problems,
)

COUNTER = CharCounter()
POLICY = Policy(anchors=(ANCHOR,), headroom_turns=0)  # each layer aims at the target
SYSTEM = {"role": "system", "content": "You are a helpful agent."}


def context(
    messages: list[dict],
    window: int = 4096,
    target: float = 0.45,
    policy: Policy = POLICY,
    **kwargs: object,
) -> Context:
    return make_context(
        messages, policy, counter=COUNTER, budget=budget_for(window, target), **kwargs
    )


async def run(name: str, messages: list[dict], plan: Plan, ctx: Context, params: object = None):
    """The layer's new plan and its decisions: one, or none when it changed nothing."""
    spec = LayerSpec(name, params if params is not None else LAYERS[name].params())
    new, decision = await run_layer(spec, messages, plan, ctx)
    return new, [] if decision is None else [decision]


def tokens(messages: list[dict], plan: Plan, ctx: Context) -> int:
    view = render(messages, plan, summary_role=ctx.summary_role)
    return ctx.fixed_tokens + sum(COUNTER.message(m) for m in view)


# --- summarizers: real functions of the request ---------------------------------------------


async def echo(request: SummaryRequest) -> str:
    """A summary made of the evicted texts' first words, within the cap."""
    text = " | ".join(content_text(m.get("content"))[:40] for m in request.evicted)
    return COUNTER.head(f"Summary: {text}", request.max_tokens)


def recorded() -> tuple[list[SummaryRequest], Callable[[SummaryRequest], Awaitable[str]]]:
    """`echo`, and the requests it was given."""
    seen: list[SummaryRequest] = []

    async def recording(request: SummaryRequest) -> str:
        seen.append(request)
        return await echo(request)

    return seen, recording


async def failing(request: SummaryRequest) -> str:
    raise TimeoutError("the summarizer took too long")


async def blank(request: SummaryRequest) -> str:
    return "   "


async def verbose(request: SummaryRequest) -> str:
    return "word " * (request.max_tokens * 2)


SUMMARIZERS: list[Callable[[SummaryRequest], Awaitable[str]] | None] = [
    None,
    echo,
    failing,
    blank,
    verbose,
]


# --- properties -------------------------------------------------------------------------------


@settings(
    max_examples=examples(400),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    messages=conversations(),
    name=st.sampled_from(sorted(LAYERS)),
    before=st.sampled_from([None, *sorted(LAYERS)]),
    window=st.sampled_from([1024, 2048, 4096, 8192]),
    target=st.sampled_from([0.3, 0.6]),
    summarizer=st.sampled_from(SUMMARIZERS),
    fixed=st.sampled_from([0, 150]),
)
async def test_each_layer_keeps_the_invariants(
    messages, name, before, window, target, summarizer, fixed
) -> None:
    ctx = context(messages, window, target, summarizer=summarizer, fixed_tokens=fixed)
    plan = Plan()
    if before is not None:
        plan, _ = await run(before, messages, plan, ctx)
    new, decisions = await run(name, messages, plan, ctx)
    view = render(messages, new)

    assert view_problems(messages, view) == []
    assert new.cut >= plan.cut
    for position, edit in plan.edits.items():
        if position >= new.cut:
            assert position in new.edits
            assert edit is not None or new.edits[position] is None
    if not decisions:
        assert new is plan
        return
    (decision,) = decisions
    assert decision.layer == name
    assert decision.tokens_before == tokens(messages, plan, ctx)
    assert decision.tokens_after == tokens(messages, new, ctx)
    assert not any(ctx.in_turn(p) for p in decision.positions)
    assert all(0 <= p < len(ctx.chain) for p in decision.positions)
    assert new.covered == len(ctx.chain)


@settings(max_examples=examples(120), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    messages=conversations(),
    name=st.sampled_from(sorted(LAYERS)),
    window=st.sampled_from([1024, 4096]),
)
async def test_a_layer_stops_at_the_target(messages, name, window) -> None:
    """Cheapest first, least first: a layer changes nothing once the view is at the target."""
    ctx = context(messages, window)
    plan, decisions = await run(name, messages, Plan(), ctx)
    if tokens(messages, Plan(), ctx) <= ctx.target_tokens:
        assert decisions == [] and plan == Plan()
    again, more = await run(name, messages, plan, ctx)
    if decisions and decisions[0].tokens_after <= ctx.target_tokens:
        assert more == [] and again is plan


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages=conversations(), name=st.sampled_from(sorted(LAYERS)))
async def test_layers_are_deterministic(messages, name) -> None:
    first = await run(name, messages, Plan(), context(messages, 2048))
    second = await run(name, messages, Plan(), context(messages, 2048))
    assert first == second


# --- examples: building blocks ------------------------------------------------------------


def text(tokens: int, tag: str = "abcd") -> str:
    """Exactly `tokens` tokens of the chars/4 counter."""
    return (tag * tokens)[: tokens * 4]


def call(call_id: str, name: str = "read_file", arguments: str = '{"path": "a.py"}') -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def block(call_id: str, result: str, name: str = "read_file", note: str | None = None) -> list:
    return [
        {"role": "assistant", "content": note, "tool_calls": [call(call_id, name)]},
        {"role": "tool", "tool_call_id": call_id, "content": result},
    ]


def agent_loop(blocks: int, result_tokens: int, names: tuple[str, ...] = ("read_file",)) -> list:
    messages = [SYSTEM, {"role": "user", "content": "Fix the failing test."}]
    for i in range(blocks):
        messages += block(f"c{i}", text(result_tokens), names[i % len(names)])
    return messages


def chat(rounds: int, tokens: int) -> list:
    messages = [SYSTEM]
    for i in range(rounds):
        messages.append({"role": "user", "content": f"question {i}: {text(tokens)}"})
        messages.append({"role": "assistant", "content": f"answer {i}: {text(tokens)}"})
    messages.append({"role": "user", "content": "and now?"})
    return messages


# --- clear_tool_results -----------------------------------------------------------------------


async def test_clear_replaces_the_oldest_results_with_the_placeholder() -> None:
    messages = agent_loop(10, 400)
    ctx = context(messages, 4096, 0.6)
    params = ClearToolResultsParams(keep_last=1)
    plan, (decision,) = await run("clear_tool_results", messages, Plan(), ctx, params)
    results = [p for p, m in enumerate(ctx.chain) if m["role"] == "tool"]
    cleared = sorted(plan.edits)
    assert cleared == list(decision.positions) == results[: len(cleared)]
    assert len(cleared) < len(results) - 2  # it stopped at the target
    for position in cleared:
        assert plan.edits[position] == {**ctx.chain[position], "content": CLEARED}
    assert decision.tokens_after <= ctx.target_tokens
    assert decision.detail == f"{len(cleared)} results, 0 messages with media"


async def test_clear_keeps_the_newest_results_and_the_current_turns() -> None:
    messages = agent_loop(8, 400)
    ctx = context(messages, 1024)  # no way to reach this target by clearing
    plan, _ = await run(
        "clear_tool_results", messages, Plan(), ctx, ClearToolResultsParams(keep_last=3)
    )
    results = [p for p, m in enumerate(ctx.chain) if m["role"] == "tool"]
    assert sorted(plan.edits) == results[:4]  # 8 results: 4 cleared, 3 kept, 1 current


async def test_clear_follows_the_tool_name_lists() -> None:
    messages = agent_loop(8, 400, names=("read_file", "bash"))
    ctx = context(messages, 1024)
    allow = ClearToolResultsParams(keep_last=0, allow_tools=("bash",))
    plan, _ = await run("clear_tool_results", messages, Plan(), ctx, allow)
    names = {p: ctx.tool_names[ctx.chain[p]["tool_call_id"]] for p in plan.edits}
    assert set(names.values()) == {"bash"} and len(names) == 3
    deny = ClearToolResultsParams(keep_last=0, deny_tools=("bash",), placeholder="[gone]")
    plan, _ = await run("clear_tool_results", messages, Plan(), ctx, deny)
    assert {ctx.tool_names[ctx.chain[p]["tool_call_id"]] for p in plan.edits} == {"read_file"}
    assert all(edit and edit["content"] == "[gone]" for edit in plan.edits.values())


async def test_clear_removes_large_documents_and_keeps_small_images() -> None:
    pdf = "data:application/pdf;base64," + "A" * 40_000  # ~30 kB: ~3,750 tokens
    small = {"type": "image_url", "image_url": {"url": png_data_url(64, 64)}}
    first = {
        "role": "user",
        "content": [
            {"type": "text", "text": "see attached"},
            {"type": "file", "file": {"filename": "a.pdf", "file_data": pdf}},
            small,
        ],
        "name": "mia",
    }
    messages = [SYSTEM, first, {"role": "assistant", "content": "read it"}, *chat(3, 20)[1:]]
    ctx = context(messages, 4096)
    plan, (decision,) = await run("clear_tool_results", messages, Plan(), ctx)
    assert plan.edits == {
        0: {
            **first,
            "content": [
                {"type": "text", "text": "see attached"},
                {"type": "text", "text": "[Old image or document cleared]"},
                small,
            ],
        }
    }
    assert decision.detail == "0 results, 1 messages with media"


async def test_clear_leaves_results_that_the_placeholder_would_not_shorten() -> None:
    messages = agent_loop(8, 2)
    ctx = context(messages, 1024)
    assert await run("clear_tool_results", messages, Plan(), ctx) == (Plan(), [])


# --- truncate_tool_fields -----------------------------------------------------------------------


async def test_truncate_keeps_the_head_and_marks_the_original_size() -> None:
    arguments = json.dumps({"path": "a.py", "content": text(700, "line")})
    messages = [
        SYSTEM,
        {"role": "user", "content": "write it"},
        {"role": "assistant", "content": None, "tool_calls": [call("c1", "write", arguments)]},
        {"role": "tool", "tool_call_id": "c1", "content": text(900, "outp")},
        {"role": "user", "content": "thanks, and now?"},
    ]
    ctx = context(messages, 2048)
    plan, (decision,) = await run("truncate_tool_fields", messages, Plan(), ctx)
    args_tokens = COUNTER.text(arguments)
    assert plan.edits[1]["tool_calls"][0]["function"]["arguments"] == (
        f"{arguments[:800]}\n[TRUNCATED original~{args_tokens} tokens]"
    )
    assert plan.edits[1]["tool_calls"][0]["id"] == "c1"
    assert plan.edits[2] == {
        **messages[3],
        "content": f"{text(200, 'outp')}\n[TRUNCATED original~900 tokens]",
    }
    assert decision.detail == "1 arguments, 1 results"


async def test_truncate_leaves_fields_within_their_thresholds_and_the_current_turn() -> None:
    messages = [*agent_loop(1, 599), *block("c9", text(3000))]
    ctx = context(messages, 1024)
    assert await run("truncate_tool_fields", messages, Plan(), ctx) == (Plan(), [])
    params = TruncateToolFieldsParams(
        result_max_tokens=300, keep_tokens=50, marker="[cut {tokens}]"
    )
    plan, _ = await run("truncate_tool_fields", messages, Plan(), ctx, params)
    assert plan.edits == {2: {**ctx.chain[2], "content": f"{text(50)}\n[cut 599]"}}


def test_truncate_parameters_are_checked() -> None:
    with pytest.raises(ValueError):
        TruncateToolFieldsParams(keep_tokens=600)


# --- drop_tool_blocks ---------------------------------------------------------------------------


async def test_drop_removes_old_blocks_whole_and_keeps_the_newest() -> None:
    messages = agent_loop(8, 300)
    ctx = context(messages, 1024, policy=Policy(protect_recent_rounds=0))
    plan, (decision,) = await run(
        "drop_tool_blocks", messages, Plan(), ctx, DropToolBlocksParams(keep_last=2)
    )
    # 7 blocks before the current turn's, 2 kept: positions 1-10 (five blocks) dropped.
    assert plan.edits == dict.fromkeys(range(1, 11))
    assert decision.detail == "5 blocks"
    assert view_problems(messages, render(messages, plan)) == []


async def test_drop_keeps_assistant_text_in_the_protected_part() -> None:
    # A system prompt over the target: every old block goes, protected or not.
    messages = [{"role": "system", "content": text(800)}, {"role": "user", "content": "go"}]
    for i in range(10):
        messages += block(f"c{i}", text(30), note=f"Now reading file {i}.")
    ctx = context(messages, 2048)
    assert 0 < ctx.protected_start < ctx.turn_start
    plan, _ = await run(
        "drop_tool_blocks", messages, Plan(), ctx, DropToolBlocksParams(keep_last=0)
    )
    for position in range(1, ctx.turn_start):
        message = ctx.chain[position]
        if position >= ctx.protected_start and message["role"] == "assistant":
            assert plan.edits[position] == {"role": "assistant", "content": message["content"]}
        else:
            assert plan.edits[position] is None
    assert view_problems(messages, render(messages, plan)) == []


# --- summarize ----------------------------------------------------------------------------------


class Recorder:
    """A summarizer that keeps the requests it got and answers with `answer`."""

    def __init__(self, answer: Callable[[SummaryRequest], Awaitable[str]] = echo) -> None:
        self.requests: list[SummaryRequest] = []
        self.answer = answer

    async def __call__(self, request: SummaryRequest) -> str:
        self.requests.append(request)
        return await self.answer(request)


async def test_summarize_cuts_at_a_round_start_and_sends_the_evicted_view() -> None:
    messages = chat(12, 60)
    image = {"type": "image_url", "image_url": {"url": "https://x.test/a.png"}}
    messages[1] = {**messages[1], "content": [{"type": "text", "text": "look"}, image]}
    recorder = Recorder()
    ctx = context(messages, 4096, summarizer=recorder, instructions="focus on bugs")
    plan, (decision,) = await run("summarize", messages, Plan(), ctx)

    assert ctx.chain[plan.cut]["role"] == "user"
    assert plan.cut <= ctx.protected_start
    (request,) = recorder.requests
    assert request.previous is None
    assert request.instructions == "focus on bugs"
    assert request.evicted[0]["content"] == [
        {"type": "text", "text": "look"},
        {"type": "text", "text": "[image]"},
    ]
    assert request.evicted[1:] == list(ctx.chain[1 : plan.cut])
    evicted_tokens = sum(ctx.chain_tokens[: plan.cut])
    assert request.max_tokens == min(int(0.3 * evicted_tokens), int(0.2 * ctx.target_tokens))
    assert plan.summary == Summary(await echo(request), "llm")
    assert decision == Decision(
        "summarize", tuple(range(plan.cut)), decision.tokens_before, decision.tokens_after, "llm"
    )
    assert decision.tokens_after <= ctx.target_tokens
    assert render(messages, plan)[1]["content"].startswith(SUMMARY_HEADING)


async def test_summarize_rolls_the_previous_summary_in() -> None:
    messages = chat(12, 60)
    recorder = Recorder()
    ctx = context(messages, 4096, summarizer=recorder)
    first, _ = await run("summarize", messages, Plan(), ctx)
    longer = [*messages, {"role": "assistant", "content": text(300)}, *chat(6, 60)[1:]]
    second, (decision,) = await run(
        "summarize", longer, first, context(longer, 4096, summarizer=recorder)
    )
    assert second.cut > first.cut
    assert recorder.requests[1].previous == first.summary
    assert decision.positions == tuple(range(first.cut, second.cut))


@pytest.mark.parametrize(
    ("answer", "detail"),
    [
        (failing, "degraded: TimeoutError"),
        (blank, "degraded: empty summary"),
        (verbose, "degraded: over-long summary"),
    ],
)
async def test_a_failed_summary_falls_back_to_the_digest(answer, detail) -> None:
    messages = chat(12, 60)
    ctx = context(messages, 4096, summarizer=Recorder(answer))
    plan, (decision,) = await run("summarize", messages, Plan(), ctx)
    assert decision.detail == detail
    assert plan.summary is not None and plan.summary.kind == "digest"
    assert plan.summary.text.startswith("User requests:\n- question")
    assert render(messages, plan)[1]["content"].startswith(DIGEST_HEADING)


async def test_a_failed_summary_after_an_llm_summary_keeps_it_and_digests_the_rest() -> None:
    messages = chat(12, 60)
    first, _ = await run("summarize", messages, Plan(), context(messages, 4096, summarizer=echo))
    assert first.summary is not None and first.summary.kind == "llm"
    longer = [*messages, {"role": "assistant", "content": text(300)}, *chat(6, 60)[1:]]
    ctx = context(longer, 4096, summarizer=Recorder(failing))
    second, (decision,) = await run("summarize", longer, first, ctx)
    # The LLM summary stays as it was; only what is evicted now is digested, after it.
    assert second.summary == Summary(first.summary.text, "llm", second.summary.tail)
    assert second.summary.tail is not None and second.summary.tail.startswith("User requests:")
    said = {int(n) for n in re.findall(r"question (\d+)", second.summary.tail)}
    assert said and said <= set(range(first.cut // 2, second.cut // 2))
    assert decision.detail == "degraded: TimeoutError"
    assert decision.tokens_after <= ctx.target_tokens
    header = render(longer, second)[1]["content"]
    assert header.startswith(f"{SUMMARY_HEADING}\n{first.summary.text}\n\n{TAIL_HEADING}\n")

    # The next LLM summary rolls the summary and its digest in.
    recorder = Recorder()
    longest = [*longer, {"role": "assistant", "content": text(300)}, *chat(6, 60)[1:]]
    third, _ = await run("summarize", longest, second, context(longest, 4096, summarizer=recorder))
    assert recorder.requests[0].previous == second.summary
    assert third.summary is not None and third.summary.tail is None


async def test_without_a_summarizer_the_digest_is_the_summary() -> None:
    messages = chat(12, 60)
    plan, (decision,) = await run("summarize", messages, Plan(), context(messages, 4096))
    assert decision.detail == "digest"
    assert plan.summary is not None and plan.summary.kind == "digest"


async def test_summarize_keeps_the_task_and_summarises_the_rounds_of_an_agent_loop() -> None:
    messages = agent_loop(6, 300)  # one round: everything to evict comes after the task
    ctx = context(messages, 2048, summarizer=echo)
    plan, _ = await run("summarize", messages, Plan(), ctx, SummarizeParams())
    view = render(messages, plan)
    assert plan.task == ctx.task == 0 and plan.cut > 1
    assert view[1] == messages[1]  # the task verbatim, right after the system message
    assert view[2]["content"].startswith(SUMMARY_HEADING)
    assert view[-2:] == messages[-2:]  # the current turn
    assert view_problems(messages, view) == []
    assert tokens(messages, plan, ctx) <= ctx.aim_tokens


@pytest.mark.parametrize(("system_tokens", "cut"), [(100, 9), (1500, 19), (2000, 23)])
async def test_an_agent_loop_s_protected_rounds_are_summarised_when_the_aim_needs_it(
    system_tokens: int, cut: int
) -> None:
    messages = agent_loop(12, 300)
    messages[0] = {"role": "system", "content": text(system_tokens)}  # a client's fixed prompt
    ctx = context(messages, 8192, summarizer=echo)
    assert (ctx.task, ctx.protected_start, ctx.turn_start) == (0, 16, 23)
    plan, _ = await run("summarize", messages, Plan(), ctx)
    # Only as far as the aim needs: up to the current turn when the fixed prompt leaves
    # room for no more, the protected rounds summarised rather than left to trim_head.
    assert plan.cut == cut and plan.task == 0
    assert tokens(messages, plan, ctx) < ctx.aim_tokens or cut == ctx.turn_start
    assert view_problems(messages, render(messages, plan)) == []


async def test_the_summary_of_agent_rounds_is_made_from_the_original_outputs() -> None:
    messages = agent_loop(8, 300)
    ctx = context(messages, 2048, summarizer=echo)
    cleared, _ = await run("clear_tool_results", messages, Plan(), ctx)
    seen, recording = recorded()
    ctx = context(messages, 2048, summarizer=recording)
    plan, _ = await run("summarize", messages, cleared, ctx)
    (request,) = seen
    assert plan.task not in request.positions
    assert request.evicted == [ctx.chain[p] for p in request.positions]
    assert set(request.positions) & set(cleared.edits)  # cleared results went in whole


async def test_a_new_task_takes_the_kept_one_s_place_and_the_old_one_is_summarised() -> None:
    messages = agent_loop(6, 300)
    ctx = context(messages, 2048, summarizer=echo)
    plan, _ = await run("summarize", messages, Plan(), ctx)
    later = [*messages, {"role": "assistant", "content": "Done."}]
    later += [{"role": "user", "content": "Now the other test."}]
    later += agent_loop(6, 300)[2:]
    seen, recording = recorded()
    ctx = context(later, 2048, summarizer=recording)
    new, _ = await run("summarize", later, plan, ctx)
    assert new.task == ctx.task and new.cut > ctx.task
    assert 0 in seen[0].positions  # the old task, no longer kept, is summarised
    assert view_problems(later, render(later, new)) == []


@pytest.mark.parametrize(
    ("policy", "window", "start"),
    [
        (Policy(protect_recent_rounds=2), 1024, 78),  # the current round and one more
        (Policy(protect_min_tokens=60, protect_min_text_messages=3), 1024, 78),
        (Policy(protect_max_tokens=80), 1024, 77),
        (Policy(), 1024, 77),  # at most half the target: 105 tokens
        (Policy(), 8192, 58),  # the newest twelve rounds
    ],
)
async def test_summarize_stops_at_the_protected_part(policy, window, start) -> None:
    messages = chat(40, 20)  # 28 tokens a question, 30 an answer
    ctx = context(messages, window, 0.3, policy=policy)
    assert ctx.protected_start == start
    plan, (decision,) = await run("summarize", messages, Plan(), ctx, SummarizeParams())
    assert plan.cut <= start
    assert decision.tokens_after <= ctx.target_tokens or plan.cut == start


# --- trim_head ------------------------------------------------------------------------------------


async def test_trim_head_drops_the_oldest_until_the_view_fits() -> None:
    messages = chat(12, 60)
    ctx = context(messages, 2048)
    plan, (decision,) = await run("trim_head", messages, Plan(), ctx, TrimHeadParams())
    dropped = sorted(plan.edits)
    assert dropped == list(range(len(dropped)))
    assert all(edit is None for edit in plan.edits.values())
    assert decision.tokens_after <= ctx.target_tokens < tokens(messages, Plan(), ctx)
    assert decision.detail == f"{len(dropped)} messages dropped"


async def test_trim_head_keeps_the_current_turn_even_when_it_does_not_fit() -> None:
    messages = [*chat(2, 10), {"role": "user", "content": text(5000)}]
    messages.pop(-2)
    ctx = context(messages, 2048)
    plan, (decision,) = await run("trim_head", messages, Plan(), ctx, TrimHeadParams())
    assert render(messages, plan) == [SYSTEM, messages[-1]]
    assert decision.tokens_after == ctx.floor_tokens > ctx.limit_tokens


async def test_trim_head_shortens_a_summary_that_leaves_no_room() -> None:
    messages = chat(3, 10)
    plan = Plan(cut=2, summary=Summary(text(2000, "summ"), "llm"), covered=7)
    ctx = context(messages, 4096)
    new, (decision,) = await run("trim_head", messages, plan, ctx, TrimHeadParams())
    assert new.summary is not None
    assert new.summary.text.startswith("summ") and new.summary.text.endswith(f"\n{SHORTENED}")
    assert decision.tokens_after <= ctx.target_tokens
    assert "summary shortened" in decision.detail


async def test_trim_head_shortens_the_digest_after_an_llm_summary_first() -> None:
    messages = chat(3, 10)
    summary = Summary(text(300, "summ"), "llm", text(2000, "tail"))
    ctx = context(messages, 4096)
    plan = Plan(cut=2, summary=summary, covered=7)
    new, (decision,) = await run("trim_head", messages, plan, ctx, TrimHeadParams())
    assert new.summary is not None and new.summary.text == summary.text
    assert new.summary.tail is None or new.summary.tail.endswith(f"\n{SHORTENED}")
    assert decision.tokens_after <= ctx.target_tokens


async def test_trim_head_keeps_the_newest_anchors_of_what_it_drops() -> None:
    messages = [SYSTEM]
    for i in range(30):
        messages += [
            {"role": "user", "content": f"order ORDER-{i:04d} {text(30)}"},
            {"role": "assistant", "content": "noted"},
        ]
    messages.append({"role": "user", "content": "which orders?"})
    ctx = context(messages, 1024)
    plan, (decision,) = await run("trim_head", messages, Plan(), ctx, TrimHeadParams())
    dropped = [f"ORDER-{p // 2:04d}" for p in sorted(plan.edits) if p % 2 == 0]
    assert plan.anchor_block is not None
    kept = plan.anchor_block.split("\n")
    assert kept == dropped[len(dropped) - len(kept) :]  # the newest that fit
    assert len(kept) < len(dropped)
    assert COUNTER.text(plan.anchor_block) <= ctx.anchor_block_max_tokens
    assert decision.tokens_after <= ctx.target_tokens


async def test_a_summary_too_short_to_be_worth_a_call_is_not_asked_for() -> None:
    """A cap under MIN_SUMMARY_TOKENS for more than MAX_SQUEEZE times as much history: the
    digest stands in, by choice (not `degraded`: nothing failed)."""
    messages = chat(12, 60)
    recorder = Recorder()
    ctx = context(messages, 4096, summarizer=recorder)
    squeezed = SummarizeParams(input_share=0.01, target_share=0.01)
    plan, (decision,) = await run("summarize", messages, Plan(), ctx, squeezed)

    assert recorder.requests == []
    assert plan.summary is not None and plan.summary.kind == "digest"
    assert decision.detail.startswith("digest: too short")
    # The same eviction with a cap worth a call asks the summarizer.
    await run("summarize", messages, Plan(), ctx, SummarizeParams())
    assert len(recorder.requests) == 1


def test_too_short_weighs_the_cap_against_what_it_would_squeeze() -> None:
    evicted = [{"role": "user", "content": "x" * 4000}]  # 1,004 tokens by the CharCounter
    assert too_short(SummaryRequest(None, evicted, 100, None), COUNTER.message)
    assert not too_short(SummaryRequest(None, evicted, 300, None), COUNTER.message)  # not under 128
    assert not too_short(SummaryRequest(None, evicted[:0], 100, None), COUNTER.message)


def test_the_anchor_block_does_not_repeat_an_anchor_that_a_kept_line_shows() -> None:
    # An order number lost with its output, and that output's finding which names it: the
    # finding shows the number, so the block holds it once.
    lost = ["ORDER-1000", "ORDER-1000 failed.", "ORDER-1001", "ORDER-1001 failed.", "ORD-9"]
    block = anchor_block(lost, 1000, COUNTER)
    assert block == "ORDER-1000 failed.\nORDER-1001 failed.\nORD-9"
