"""The decision flow built from real traces: every node, every number."""

from __future__ import annotations

from contextlab.lib.flow import build_flow
from contextlab.sessions.models import Turn


def _numbers(node):
    return dict(node.numbers)


def test_it_draws_a_quiet_turn_through_the_empty_branch(worked_session):
    turn = Turn.objects.get(session=worked_session, number=1)
    flow = build_flow(turn.trace)
    assert not flow.compacting
    assert flow.nodes["skip"].on_path
    assert not flow.nodes["initial"].on_path and not flow.nodes["llm"].on_path
    gate = turn.trace["steps"][0]["numbers"]
    assert _numbers(flow.nodes["gate"])["threshold"] == f"{gate['threshold']:,}"
    assert _numbers(flow.nodes["gate"])["left"] == f"{gate['left']:,}"
    assert _numbers(flow.nodes["result"])["payload tokens"] == f"{turn.payload_tokens:,}"


def test_it_draws_a_compacting_turn_with_its_numbers(worked_session):
    turns = list(Turn.objects.filter(session=worked_session, outcome="compacted").order_by("number"))
    first, later = turns[0], turns[-1]
    flow = build_flow(first.trace)
    assert flow.compacting and not flow.nodes["skip"].on_path
    assert flow.nodes["initial"].state == "fired" and not flow.nodes["incremental"].on_path
    steps = {s["step"]: s for s in first.trace["steps"]}
    split = _numbers(flow.nodes["context_check"])
    assert split["to compact"] == f"{steps['context_check']['numbers']['compact_count']:,}"
    assert split["kept tokens"] == f"{steps['context_check']['numbers']['kept_tokens']:,}"
    mark = _numbers(flow.nodes["mark_compressed"])
    assert mark["archived"] == f"{steps['mark_compressed']['numbers']['archived']:,}"
    assert flow.nodes["mark_compressed"].links[0].path.startswith("dialog/")
    assert "offline extractive compactor" in flow.nodes["llm"].notes[0]
    assert build_flow(later.trace).nodes["incremental"].state == "fired"


def test_it_keeps_steps_it_does_not_know():
    trace = {"turn": 3, "trigger": "auto", "policy": "eviction", "outcome": "evicted", "budget": {"window": 100},
             "steps": [{"step": "gate", "status": "ok", "numbers": {"threshold": 70}},
                       {"step": "eviction", "status": "fired", "numbers": {"evicted": 4, "plan": {"x": 1}},
                        "outcome": "evicted 4 units"},
                       {"step": "result", "status": "ok", "numbers": {"total": 50}}]}
    flow = build_flow(trace)
    assert [n.title for n in flow.extra] == ["eviction"]
    assert flow.extra[0].numbers == [("evicted", "4")]
    assert not flow.nodes["context_check"].on_path
