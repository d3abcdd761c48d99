"""Plans across an upgrade: a session state stored by the version before plans kept an agent
loop's task (tests/data/plans_before_task.json, as that version wrote it) loads and renders
the views that version forwarded, compacts on from there, and plans without a task are stored
as that version stores them, so replicas of both versions share one Redis."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import orjson
import pytest

from policies import Plan, Policy, compact, render
from proxy.sessions.state import SessionState
from tests.conversations import CharCounter, budget_for, view_problems

FIXTURE = json.loads((Path(__file__).parent / "data" / "plans_before_task.json").read_text())
COUNTER = CharCounter()


def stored() -> SessionState:
    return SessionState.from_bytes(orjson.dumps(FIXTURE["state"]))


def test_a_state_of_the_previous_version_loads_and_renders_its_views() -> None:
    state = stored()
    for branch, session in zip(state.branches, FIXTURE["sessions"], strict=True):
        assert branch.plan.task is None
        assert render(session["messages"], branch.plan) == session["view"]


def test_plans_without_a_task_are_stored_as_the_previous_version_stores_them() -> None:
    state = stored()
    assert json.loads(state.to_bytes()) == FIXTURE["state"]


async def test_an_agent_loop_compacts_on_from_a_plan_of_the_previous_version() -> None:
    (loop, _), plan = FIXTURE["sessions"], stored().branches[0].plan
    messages = loop["messages"]
    more = copy.deepcopy(messages[-6:])  # three more rounds, the same outputs
    for n in range(0, 6, 2):
        call_id = f"more_{n}"
        more[n]["tool_calls"][0]["id"] = more[n + 1]["tool_call_id"] = call_id
    grown = messages + more
    result = await compact(
        grown, plan, budget=budget_for(4096, 0.45), policy=Policy(), counter=COUNTER
    )
    assert result.plan.cut >= plan.cut and result.plan.task == 2  # the task, verbatim
    assert result.plan.summary is not None
    assert view_problems(grown, result.view) == []
    again = Plan.from_dict(json.loads(json.dumps(result.plan.to_dict())))
    assert again == result.plan and render(grown, again) == result.view


@pytest.mark.parametrize("task", [-1, 20, "2", 1.0])
def test_a_task_that_is_not_a_position_before_the_cut_is_no_plan(task: object) -> None:
    data = {**FIXTURE["state"]["branches"][1]["plan"], "task": task}
    with pytest.raises(ValueError, match="task"):
        Plan.from_dict(data)
