"""Staged compaction: plan, summary call with nothing held, commit onto a state that may have moved."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contextlab.engine.compactors.extractive import ExtractiveCompactor
from contextlab.engine.core.profile import Profile
from contextlab.engine.hook import ContextManager
from contextlab.engine.stages.summary.plan import StalePlan
from tests.engine.sessions import assistant, log_lines, tool_round, user

SMALL = Profile(max_input_length=4_000, recent_n=2, recent_max_bytes=1_500, old_max_bytes=400)


# Twelve rounds are past the point where CoPaw's own estimate compacts (the contextlab policy
# waits for it while the payload fits the window): the next prepare compacts.
def filled(workspace: Path, rounds: int = 12, profile: Profile = SMALL) -> ContextManager:
    manager = ContextManager(profile, workspace, system_prompt="You are a build assistant.",
                             compactor=ExtractiveCompactor())
    for i in range(rounds):
        manager.append([user(f"step {i}: build target {i}"),
                        *tool_round("bash", {"command": f"make t{i}"}, [log_lines(40, f"t{i}")]),
                        assistant(f"target {i} built")])
    return manager


def files_under(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_it_plans_without_changing_the_engine_or_the_workspace(tmp_path) -> None:
    manager = filled(tmp_path / "ws")
    state = json.dumps(manager.export_state(), sort_keys=True)
    files = files_under(tmp_path / "ws")
    plan = manager.plan_compaction()
    assert plan is not None and plan.trigger == "auto"
    assert plan.compact_ids and set(plan.compact_ids) < set(plan.live_ids)
    assert json.dumps(manager.export_state(), sort_keys=True) == state
    assert files_under(tmp_path / "ws") == files


def test_it_plans_nothing_under_the_threshold(tmp_path) -> None:
    manager = filled(tmp_path / "ws", rounds=2)
    assert manager.plan_compaction() is None
    assert manager.plan_compaction(manual=True) is not None


def test_it_commits_the_same_compaction_as_an_unstaged_turn(tmp_path) -> None:
    staged = filled(tmp_path / "a")
    direct = filled(tmp_path / "b")
    plan = staged.plan_compaction()
    assert plan is not None
    result = staged.prepare(planned=staged.summarize_plan(plan))
    expected = direct.prepare()
    assert result.trace.outcome == expected.trace.outcome == "compacted"
    # Ids differ between the two conversations (a global counter makes them); the shape may not.
    assert [m.plain_text() for m in staged.messages] == [m.plain_text() for m in direct.messages]
    assert len(staged.archived_ids) == len(direct.archived_ids) > 0


def test_it_keeps_messages_appended_while_the_summary_was_written(tmp_path) -> None:
    manager = filled(tmp_path / "ws")
    plan = manager.plan_compaction()
    assert plan is not None
    planned = manager.summarize_plan(plan)
    late = [user("one more thing"), *tool_round("bash", {"command": "make late"}, [log_lines(5, "late")])]
    manager.append(late)
    result = manager.prepare(planned=planned)
    assert result.trace.outcome == "compacted"
    assert set(plan.compact_ids).isdisjoint(manager.live_ids())
    assert [m.id for m in late] == manager.live_ids()[-len(late):]
    check = result.trace.get("context_check")
    assert check is not None and check.details["planned"]["rebased_over"] == [m.id for m in late]


def test_it_refuses_a_plan_another_compaction_overtook(tmp_path) -> None:
    manager = filled(tmp_path / "ws")
    plan = manager.plan_compaction()
    assert plan is not None
    planned = manager.summarize_plan(plan)
    manager.compact()
    with pytest.raises(StalePlan):
        manager.prepare(planned=planned)


def test_it_defers_the_summary_while_another_call_is_in_flight(tmp_path) -> None:
    manager = filled(tmp_path / "ws")
    live = manager.live_ids()
    result = manager.prepare(defer_summary=True)
    assert result.trace.outcome == "compaction_deferred"
    assert manager.live_ids() == live and manager.summary is None


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rounds=st.integers(min_value=12, max_value=16), late=st.integers(min_value=0, max_value=4),
       manual=st.booleans())
def test_it_never_loses_or_duplicates_a_message(tmp_path_factory, rounds: int, late: int, manual: bool) -> None:
    manager = filled(tmp_path_factory.mktemp("ws"), rounds=rounds)
    plan = manager.plan_compaction(manual=manual)
    assert plan is not None
    planned = manager.summarize_plan(plan)
    appended = []
    for i in range(late):
        batch = [user(f"late {i}"), assistant(f"late answer {i}")]
        manager.append(batch)
        appended.extend(m.id for m in batch)
    if manual:
        manager.compact(planned=planned)
    else:
        manager.prepare(planned=planned)
    everything = plan.live_ids + appended
    kept = manager.live_ids() + manager.archived_ids
    assert sorted(kept) == sorted(everything)
    assert manager.live_ids()[len(manager.live_ids()) - len(appended):] == appended
