"""A dialect writes a view of `policies.render_entries` by its runs (`policies.View`): the
body is byte for byte the one it writes of the same entries a step per message, for chat
completions and the Responses API (proxy/dialects/base.py); and a turn counts it by its runs
as it counts those entries (`Turn.tokens`)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies import Chain, Plan, Summary, render_entries
from proxy.compaction.histories import Counts
from proxy.compaction.turn import Turn
from proxy.dialects.base import Dialect
from proxy.dialects.openai.chat import Chat
from proxy.dialects.openai.responses import Responses
from proxy.errors import InvalidRequest
from proxy.models.tokens import counter_for
from tests.conftest import examples
from tests.conversations import conversations
from tests.test_raw_items import written
from tests.test_responses_dialect import histories


@st.composite
def plans(draw: st.DrawFn, messages: list[dict[str, Any]]) -> Plan:
    """Any plan over `messages`: a cut, a task, a header or none, runs of drops and edits
    (one that changes nothing of its message: it shows the message itself), any `covered`."""
    length = len(Chain.of(messages))
    cut = draw(st.integers(0, length + 1))
    task = draw(st.none() | st.integers(0, cut - 1)) if cut else None
    positions = st.integers(0, length + 1)
    edits: dict[int, dict[str, Any] | None] = dict.fromkeys(
        draw(st.lists(positions, max_size=length + 2))
    )
    for position in draw(st.lists(positions, max_size=3)):
        edits[position] = draw(st.sampled_from([{"content": "[edit]"}, {}]))
    summary = draw(st.none() | st.just(Summary("s", "llm")))
    covered = draw(st.integers(0, length + 1))
    return Plan(cut, summary, edits, None, covered, task=task)


@settings(max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(["chat", "responses"]), st.data())
def test_a_view_is_written_by_its_runs_as_a_step_per_message_writes_it(
    api: str, data: st.DataObject
) -> None:
    """Whatever the plan, and whether the runs are of the items of a known body, of those
    after it or of both."""
    dialect: Dialect = Chat(split_from=0) if api == "chat" else Responses(split_from=0)
    field = dialect.conversation_param
    items = data.draw(conversations() if api == "chat" else histories())
    texts = [data.draw(written(item)) for item in items]
    for cut in sorted({data.draw(st.integers(0, len(items))), len(items)}):
        raw = f'{{"model": "gpt-4o", "{field}": [{", ".join(texts[:cut])}]}}'.encode()
        try:
            parsed = dialect.parse(raw)
        except InvalidRequest:
            return  # a history the API refuses (some of `histories` are)
    messages = parsed.messages
    plan = data.draw(plans(messages))
    counter = counter_for("gpt-4o")
    counts = Counts(counter.message(message) for message in messages)
    request, limits = SimpleNamespace(messages=messages), SimpleNamespace(counter=counter)
    turn = Turn(request, limits, None, 3, counts, Chain.of(messages), None, None)  # type: ignore[arg-type]
    for role in ("user", "assistant"):
        view = render_entries(messages, plan, summary_role=role)
        assert dialect.render(parsed, view) == dialect.render(parsed, list(view))
        assert turn.tokens(view) == turn.tokens(list(view))
